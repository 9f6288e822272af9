package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// report collects the run's drains and handovers and renders them as
// markdown.
type report struct {
	o                  options
	loadStart, loadEnd string
	drains             []drainResult
	handovers          []handoverResult
}

// describe names a mode for the tables.
func (r *report) describe(mode string) string {
	switch mode {
	case "parts-1":
		return fmt.Sprintf("%d partitions, 1 process", r.o.partitions)
	case "parts-n":
		return fmt.Sprintf("%d partitions, %d processes", r.o.partitions, r.o.procs)
	case "queue-1":
		return "one queue, 1 process"
	case "queue-n":
		return fmt.Sprintf("one queue, %d processes", r.o.procs)
	}
	return mode
}

func (r *report) drainOf(mode string, round int) *drainResult {
	for i := range r.drains {
		if r.drains[i].mode == mode && r.drains[i].round == round {
			return &r.drains[i]
		}
	}
	return nil
}

// rates returns mode's events/s by round.
func (r *report) rates(mode string) []float64 {
	var out []float64
	for _, d := range r.drains {
		if d.mode == mode {
			out = append(out, d.rate())
		}
	}
	return out
}

// roundRatios returns, for every round in which both ran, a's events/s over b's.
func (r *report) roundRatios(a, b string) []float64 {
	var out []float64
	for round := 1; round <= r.o.repeat; round++ {
		if x, y := r.drainOf(a, round), r.drainOf(b, round); x != nil && y != nil {
			out = append(out, x.rate()/y.rate())
		}
	}
	return out
}

// median is the median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// spread is "median (rounds min–max)" of ratios.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	if len(xs) == 1 {
		return fmt.Sprintf("%.2f×", xs[0])
	}
	return fmt.Sprintf("**%.2f×** (rounds %.2f–%.2f×)", median(xs), slices.Min(xs), slices.Max(xs))
}

func shares(perLabel map[string]int) string {
	labels := slices.Sorted(func(yield func(string) bool) {
		for l := range perLabel {
			if !yield(l) {
				return
			}
		}
	})
	var parts []string
	for _, l := range labels {
		parts = append(parts, fmt.Sprintf("%s %d", l, perLabel[l]))
	}
	return strings.Join(parts, ", ")
}

func msec(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)) }

func (r *report) markdown() string {
	var w strings.Builder
	o := r.o
	style := "`tx.Exec`"
	if o.deferred {
		style = "`consumer.Defer`"
	}
	fmt.Fprintf(&w, "\n### Partitions: throughput and handover\n\nCommand: `%s`\n\n", o.args)
	fmt.Fprintf(&w, "Load average %s at the start, %s at the end. %d events (+%.0f%% published again %d events later) on %d accounts; "+
		"OrderingKey = account; the handler applies each event and checks its account's order in one statement (%s); default Config otherwise.\n\n",
		r.loadStart, r.loadEnd, o.n, 100*o.dup, dupDelay, o.accounts, style)
	if len(r.drains) > 0 {
		w.WriteString("| mode | round | events/s | seconds | worker core-µs per event | messages per commit | applied once | out of order | duplicates skipped | events per process |\n")
		w.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, d := range r.drains {
			perCommit := float64(d.stats.Processed+d.stats.Duplicates) / float64(max(d.stats.Batches, 1))
			fmt.Fprintf(&w, "| %s | %d | %.0f | %.2f | %.0f | %.1f | %d of %d | %d | %d | %s |\n", r.describe(d.mode), d.round, d.rate(),
				d.window.Seconds(), d.workerMicros(), perCommit, d.once, d.n, d.violations, d.stats.Duplicates, shares(d.perLabel))
		}
		w.WriteString("\n| mode | events/s (median) | rounds | out of order (all rounds) |\n|---|---:|---|---:|\n")
		for _, mode := range o.modes {
			rates := r.rates(mode)
			bad := 0
			for _, d := range r.drains {
				if d.mode == mode {
					bad += d.violations
				}
			}
			fmt.Fprintf(&w, "| %s | %.0f | %.0f–%.0f | %d |\n", r.describe(mode), median(rates), slices.Min(rates), slices.Max(rates), bad)
		}
		w.WriteString("\n| ratio (same round, median) | measured |\n|---|---|\n")
		for _, pair := range [][2]string{{"parts-n", "parts-1"}, {"queue-n", "queue-1"}, {"parts-1", "queue-1"}, {"parts-n", "queue-n"}} {
			if xs := r.roundRatios(pair[0], pair[1]); len(xs) > 0 {
				fmt.Fprintf(&w, "| %s / %s | %s |\n", r.describe(pair[0]), r.describe(pair[1]), spread(xs))
			}
		}
		w.WriteString("\n")
	}
	if len(r.handovers) > 0 {
		fmt.Fprintf(&w, "Handover: %d processes on %d partitions, events offered at %d/s (duplicates included); %s killed with SIGKILL after %v, publishing for %v more. "+
			"A partition's handover is the time from the kill to the first of its events a survivor applied.\n\n",
			o.procs, o.partitions, o.rate, r.handovers[0].victim, o.before, o.after)
		w.WriteString("| round | locks taken over | killed process's partitions → taken by (ms after the kill to its first event applied) | handover (max) | events | applied once | out of order | events per process |\n")
		w.WriteString("|---:|---:|---|---:|---:|---:|---:|---|\n")
		var maxes, locks []float64
		for _, h := range r.handovers {
			var parts []string
			for _, p := range h.parts {
				parts = append(parts, fmt.Sprintf("%s → %s (%s)", p.part[strings.LastIndex(p.part, ".")+1:], p.took, msec(p.gap)))
			}
			maxes = append(maxes, float64(h.max())/float64(time.Millisecond))
			locks = append(locks, float64(h.relocked)/float64(time.Millisecond))
			fmt.Fprintf(&w, "| %d | %s ms | %s | %s ms | %d | %d of %d | %d | %s |\n", h.round, msec(h.relocked), strings.Join(parts, ", "),
				msec(h.max()), h.events, h.once, h.events, h.violations, shares(h.perLabel))
		}
		fmt.Fprintf(&w, "\nHandover, max over the killed process's partitions: median %.0f ms (rounds %.0f–%.0f ms); "+
			"every partition's lock held by a survivor after a median %.0f ms (rounds %.0f–%.0f ms).\n",
			median(maxes), slices.Min(maxes), slices.Max(maxes), median(locks), slices.Min(locks), slices.Max(locks))
	}
	w.WriteString(method)
	return w.String()
}

// failures is an error naming every drain that lost or doubled an event,
// and every partitioned one that applied an event out of order.
func (r *report) failures() error {
	var errs []error
	for _, d := range r.drains {
		if d.once != d.n || d.applied != d.n {
			errs = append(errs, fmt.Errorf("%s round %d: %d applied, %d distinct, of %d events", d.mode, d.round, d.applied, d.once, d.n))
		}
		if strings.HasPrefix(d.mode, "parts-") && d.violations > 0 {
			errs = append(errs, fmt.Errorf("%s round %d: %d events out of order", d.mode, d.round, d.violations))
		}
	}
	for _, h := range r.handovers {
		if h.once != h.events || h.applied != h.events || h.violations > 0 {
			errs = append(errs, fmt.Errorf("handover round %d: %d applied, %d distinct, of %d events, %d out of order",
				h.round, h.applied, h.once, h.events, h.violations))
		}
	}
	return errors.Join(errs...)
}

const method = `
Method. Every drain and handover gets a fresh consumer (its own queues,
exchange and inbox) and the handler's tables emptied. A drain's events are
published before its worker processes start (the same seeded sequence in
every drain); its events/s is the number of events over the time from the
first to the last event applied (the handler's clock_timestamp()), so
that process start-up and the lease's first turn are not counted; the
workers are stopped (SIGTERM) once every event is applied and the queues
are empty. "worker core-µs per event" is the user and system CPU of the
worker processes, start-up included, over the events. "applied once"
counts distinct events among the applied rows (every row must be distinct
and every event there); "out of order" counts events whose account's
previous applied event was not the one before it. With one queue and
several processes, an account's events go to several processes and their
batches commit in whatever order they finish: only partitions keep the
order. In the handover run, a partition belonged to the killed process if
the last event applied from it before the kill was that process's; "locks
taken over" is when the survivors' lease sessions held every partition's
advisory lock again, each its share (pg_locks, polled every 10 ms).
`
