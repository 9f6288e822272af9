// Package cpustat reads the machine's CPU time counters from /proc/stat, for
// benchmarks that report how busy the machine was and how much of it the
// hypervisor gave to other virtual machines ("steal").
package cpustat

import (
	"os"
	"strconv"
	"strings"
)

// Times are the machine's CPU time counters in jiffies, summed over all CPUs.
type Times struct {
	Total int64 // every state
	Busy  int64 // every state but idle, iowait and steal
	Steal int64 // time the hypervisor gave to other virtual machines
}

// Read returns the current counters; zero when /proc/stat cannot be read.
func Read() Times {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Times{}
	}
	return parse(string(raw))
}

// parse reads the aggregate "cpu" line: user nice system idle iowait irq
// softirq steal guest guest_nice.
func parse(stat string) Times {
	var t Times
	line, _, _ := strings.Cut(stat, "\n")
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "cpu" {
		return t
	}
	for i, f := range fields[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		t.Total += v
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			t.Steal += v
		default:
			t.Busy += v
		}
	}
	return t
}

// StealSince is the percentage of the CPUs' time stolen between t0 and t.
func (t Times) StealSince(t0 Times) float64 {
	if t.Total <= t0.Total {
		return 0
	}
	return 100 * float64(t.Steal-t0.Steal) / float64(t.Total-t0.Total)
}

// LoadAvg returns the machine's 1, 5 and 15 minute load averages, the
// first three fields of /proc/loadavg, or "?" when it cannot be read.
func LoadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
