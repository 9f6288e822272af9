package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/cpustat"
)

// clockTick is USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuSnapshot is the CPU time used so far by this process, by the
// benchmark's PostgreSQL processes (its own backends, found by
// application_name, and the server's background processes; other clients'
// backends are not counted), by RabbitMQ (beam.smp), and by the whole machine.
type cpuSnapshot struct {
	self     time.Duration
	postgres map[int]time.Duration // by pid
	rabbitmq map[int]time.Duration
	machine  cpustat.Times
}

// pgPIDsSQL lists the PostgreSQL processes attributed to the benchmark.
const pgPIDsSQL = `SELECT pid FROM pg_stat_activity WHERE application_name = $1 OR backend_type <> 'client backend'`

func (b *bench) takeCPU(ctx context.Context) cpuSnapshot {
	s := cpuSnapshot{postgres: map[int]time.Duration{}, rabbitmq: map[int]time.Duration{}}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if rows, err := b.pool.Query(ctx, pgPIDsSQL, b.appName()); err == nil {
		pids, _ := pgx.CollectRows(rows, pgx.RowTo[int32])
		for _, pid := range pids {
			if t, ok := procCPU(int(pid), "postgres"); ok {
				s.postgres[int(pid)] = t
			}
		}
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if t, ok := procCPU(pid, "beam.smp"); ok {
			s.rabbitmq[pid] = t
		}
	}
	s.machine = cpustat.Read()
	return s
}

// procCPU is the user+system CPU time of process pid if its command is comm.
func procCPU(pid int, comm string) (time.Duration, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false // the process ended
	}
	lp, rp := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
	if lp < 0 || rp < lp || string(raw[lp+1:rp]) != comm {
		return 0, false
	}
	// After the command come state (field 3) … utime (14) and stime (15).
	f := strings.Fields(string(raw[rp+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * clockTick, true
}

// cpuUse is the CPU used between two snapshots, in seconds of one core.
// Processes that ended in between are missing (the pool keeps its
// connections, so this is rare); other is the rest of the machine's busy
// time (other agents' load included).
type cpuUse struct {
	self, postgres, rabbitmq, other time.Duration
	machine                         float64 // busy fraction of all cores
	steal                           float64 // fraction of all cores' time taken by other guests
}

// grown sums, over the processes alive at b, the CPU they used since a (all
// of it for processes that started in between).
func grown(a, b map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range b {
		d += t - a[pid]
	}
	return d
}

func cpuBetween(a, b cpuSnapshot, wall time.Duration, cpus int) cpuUse {
	u := cpuUse{self: b.self - a.self, postgres: grown(a.postgres, b.postgres), rabbitmq: grown(a.rabbitmq, b.rabbitmq)}
	if t := b.machine.Total - a.machine.Total; t > 0 {
		u.machine = float64(b.machine.Busy-a.machine.Busy) / float64(t)
		u.steal = b.machine.StealSince(a.machine) / 100
		busy := time.Duration(u.machine * float64(wall) * float64(cpus))
		u.other = max(busy-u.self-u.postgres-u.rabbitmq, 0)
	}
	return u
}
