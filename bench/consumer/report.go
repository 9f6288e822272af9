package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// writeTarget writes the row of one mode's target against one baseline:
// the median ratio, and with several rounds their range and how many met it.
func (r *report) writeTarget(w *strings.Builder, mode, baseName string, want float64, rate func(modeResult) float64) {
	base, ok := r.medianOf(baseName, rate)
	v, ok2 := r.medianOf(mode, rate)
	if !ok || !ok2 {
		return
	}
	got := v / base
	part := fmt.Sprintf("%.2f×", got)
	if rounds := r.roundRatios(mode, baseName); len(rounds) > 1 {
		k := 0
		for _, x := range rounds {
			if x >= want {
				k++
			}
		}
		part += fmt.Sprintf(" (rounds %.2f–%.2f×, %d of %d at or above)", slices.Min(rounds), slices.Max(rounds), k, len(rounds))
	}
	met := "no"
	if got >= want {
		met = "yes"
	}
	fmt.Fprintf(w, "| %s ≥ %.2f × %s (msg/s) | %s | %s |\n", mode, want, baseName, part, met)
}

// report collects the run's results and renders them as markdown.
type report struct {
	opts    options
	machine machine
	modes   []modeResult
	latency *latencyResult
	memory  *memoryResult
}

// modeTarget is what a handler style must reach, as medians of the rounds:
// at least vsNaive × the naive consumer and vsRaw × raw consumption (0: no
// target).
type modeTarget struct {
	mode           string
	vsNaive, vsRaw float64
}

// The targets: the plain tx.Exec handler with the default Config (no
// OrderingKey, no Defer), the same with an OrderingKey, and with Defer.
var modeTargets = []modeTarget{{"idem", 4, 0.25}, {"idem-ordered", 0, 0.35}, {"idem-deferred", 0, 0.65}}

// The latency target: p99 publish → commit at targetP99AtRate msg/s within
// targetP99Factor × the broker-alone p99 of the same run.
const (
	targetP99Factor = 1.5
	targetP99AtRate = 200
)

// modeIn returns mode name's result of round, or nil.
func (r *report) modeIn(name string, round int) *modeResult {
	for i := range r.modes {
		if r.modes[i].mode == name && r.modes[i].round == round {
			return &r.modes[i]
		}
	}
	return nil
}

// medianOf returns the median over the rounds of f of mode name's results,
// and false if the mode did not run.
func (r *report) medianOf(name string, f func(modeResult) float64) (float64, bool) {
	var v []float64
	for _, x := range r.modes {
		if x.mode == name {
			v = append(v, f(x))
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

func ratio(a *modeResult, base *modeResult) string {
	if base == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a.rate()/base.rate())
}

// roundRatios returns, for every round in which both ran, name's msg/s over
// base's.
func (r *report) roundRatios(name, base string) []float64 {
	var out []float64
	for round := 1; round <= r.opts.repeat; round++ {
		if x, b := r.modeIn(name, round), r.modeIn(base, round); x != nil && b != nil {
			out = append(out, x.rate()/b.rate())
		}
	}
	return out
}

// median is the median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0
	}
	return (s[(n-1)/2] + s[n/2]) / 2
}

// ratioSummary says how segment ratios compare with the latency target:
// their median, range, and how many are within it.
func ratioSummary(xs []float64) string {
	within := 0
	for _, x := range xs {
		if x <= targetP99Factor {
			within++
		}
	}
	return fmt.Sprintf("%.2f× (segments %.2f–%.2f×, %d of %d within)", median(xs), slices.Min(xs), slices.Max(xs), within, len(xs))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// markdown is the report as BENCHMARKS.md shows it: the machine, the
// throughput modes, their medians, the targets, latency and memory.
func (r *report) markdown() string {
	var w strings.Builder
	m := r.machine
	fmt.Fprintf(&w, "### Consumer runtime: throughput, latency, memory\n\n")
	fmt.Fprintf(&w, "Command: `%s`\n\n", r.opts.args)
	fmt.Fprintf(&w, "Machine: %d CPUs (%s), %s, PostgreSQL %s (%s), RabbitMQ %s; broker and database local. "+
		"Load average %s at start, %s at end.\n\n", m.cpus, m.cpuModel, m.goVersion, m.postgres, m.pgSettings,
		m.rabbitmq, m.loadStart, m.loadEnd)
	r.writeModes(&w)
	r.writeMedians(&w)
	r.writeTargets(&w)
	r.writeLatency(&w)
	w.WriteString(method)
	return w.String()
}

// writeModes writes one row per mode and round.
func (r *report) writeModes(w *strings.Builder) {
	if len(r.modes) == 0 {
		return
	}
	fmt.Fprintf(w, "%d messages of %d bytes per mode, prefetch %d, %d accounts, handler = one UPDATE.\n\n",
		r.opts.n, bodySize, r.opts.prefetch, r.opts.accounts)
	w.WriteString("| mode | msg/s | × naive | × raw | seconds | CPU s: bench / postgres / rabbitmq / other | core-µs per msg | machine busy | steal | commits | msg/commit | avg commit ms | batch retries (deadlocks) | postponed |\n")
	w.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.modes {
		x := &r.modes[i]
		raw, naive := r.modeIn("raw", x.round), r.modeIn("naive", x.round)
		commits, perCommit, commitMs, retries, postponed := "—", "—", "—", "—", "—"
		switch {
		case x.mode == "naive":
			commits, perCommit = fmt.Sprint(x.n), "1.0"
		case x.idem != nil:
			s := x.idem
			commits = fmt.Sprint(s.batches)
			perCommit = fmt.Sprintf("%.1f", float64(x.n)/float64(max(s.batches, 1)))
			commitMs = fmt.Sprintf("%.2f", 1000*s.commitSeconds/float64(max(s.commits, 1)))
			retries = fmt.Sprintf("%d (%d)", s.retries, s.contention)
			postponed = fmt.Sprint(s.postponed)
		}
		label := x.mode
		if r.opts.repeat > 1 {
			label += fmt.Sprintf(" #%d", x.round)
		}
		if x.capped {
			label += fmt.Sprintf(" (capped: %d of %d done in %v)", x.n, r.opts.n, r.opts.cap)
		}
		u := x.cpu
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %.2f | %.2f / %.2f / %.2f / %.2f | %.0f | %.0f%% | %.0f%% | %s | %s | %s | %s | %s |\n",
			label, x.rate(), ratio(x, naive), ratio(x, raw), x.elapsed.Seconds(),
			u.self.Seconds(), u.postgres.Seconds(), u.rabbitmq.Seconds(), u.other.Seconds(),
			x.coreMicros(), 100*u.machine, 100*u.steal, commits, perCommit, commitMs, retries, postponed)
	}
	w.WriteString("\n")
}

// writeMedians writes each mode's median over the rounds.
func (r *report) writeMedians(w *strings.Builder) {
	if r.opts.repeat <= 1 || len(r.modes) == 0 {
		return
	}
	rate := func(x modeResult) float64 { return x.rate() }
	fmt.Fprintf(w, "Medians over the %d rounds (the ratios are ratios of medians):\n\n", r.opts.repeat)
	w.WriteString("| mode | msg/s | × naive | × raw | core-µs per msg |\n|---|---:|---:|---:|---:|\n")
	naive, hasNaive := r.medianOf("naive", rate)
	raw, hasRaw := r.medianOf("raw", rate)
	of := func(v, base float64, ok bool) string {
		if !ok {
			return "—"
		}
		return fmt.Sprintf("%.2f×", v/base)
	}
	for _, name := range allModes {
		if v, ok := r.medianOf(name, rate); ok {
			core, _ := r.medianOf(name, modeResult.coreMicros)
			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %.0f |\n", name, v, of(v, naive, hasNaive), of(v, raw, hasRaw), core)
		}
	}
	w.WriteString("\n")
}

// writeTargets writes the table of targets: throughput against the
// baselines, the latency factor, memory.
func (r *report) writeTargets(w *strings.Builder) {
	rate := func(x modeResult) float64 { return x.rate() }
	w.WriteString("| target | measured | met |\n|---|---|---|\n")
	for _, t := range modeTargets {
		for _, base := range []struct {
			name string
			want float64
		}{{"naive", t.vsNaive}, {"raw", t.vsRaw}} {
			if base.want > 0 {
				r.writeTarget(w, t.mode, base.name, base.want, rate)
			}
		}
	}
	if l := r.latency; l != nil {
		idem, naive := ratioSummary(l.ratios), ratioSummary(l.naiveRatios)
		met := "yes"
		if median(l.ratios) > targetP99Factor {
			met = "no"
		}
		if l.offered != targetP99AtRate {
			met += fmt.Sprintf(" (measured at %d msg/s, the target is at %d)", l.offered, targetP99AtRate)
		}
		fmt.Fprintf(w, "| p99 publish → commit at %d msg/s ≤ %.1f × the broker alone's p99, segment by segment (median) | idem %s; the naive consumer %s. Whole run: idem %s ms (its own part, received → commit, %s ms), naive %s ms, broker alone %s ms | %s |\n",
			targetP99AtRate, targetP99Factor, idem, naive, ms(l.commit.p99), ms(l.own.p99), ms(l.naive.p99), ms(l.broker.p99), met)
	}
	if mem := r.memory; mem != nil {
		fmt.Fprintf(w, "| resident memory at prefetch %d reported | VmHWM %.1f MiB, VmRSS %.1f MiB | reported |\n",
			mem.Prefetch, float64(mem.HWMkB)/1024, float64(mem.RSSkB)/1024)
	}
	w.WriteString("\n")
}

// writeLatency writes the latency percentiles and the memory figures.
func (r *report) writeLatency(w *strings.Builder) {
	if l := r.latency; l != nil {
		fmt.Fprintf(w, "Latency (idem with OrderingKey = account): %d messages offered at %d msg/s over %.1f s in %d segments, each after one as long for the broker alone and one for the naive consumer; %d commits (%.2f msg/commit).\n\n",
			l.sent, l.offered, l.duration.Seconds(), len(l.ratios), l.batches, float64(l.sent)/float64(max(l.batches, 1)))
		w.WriteString("| ms | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|\n")
		row := func(name string, p percentiles) {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", name, ms(p.p50), ms(p.p90), ms(p.p99), ms(p.max))
		}
		row("baseline: broker alone, publish → delivery", l.broker)
		row("baseline: naive consumer, publish → commit returned", l.naive)
		row("publish → received by the runtime", l.received)
		row("received → commit returned (idem's own part)", l.own)
		row("publish → commit returned", l.commit)
		w.WriteString("\n")
	}
	if mem := r.memory; mem != nil {
		fmt.Fprintf(w, "Memory (idem with OrderingKey = account, in a child process that only consumes): %d messages at prefetch %d "+
			"(%.0f msg/s): VmHWM %d kB, VmRSS %d kB after the run; Go runtime Sys %.1f MiB, HeapSys %.1f MiB.\n\n",
			mem.N, mem.Prefetch, float64(mem.N)/mem.Seconds, mem.HWMkB, mem.RSSkB,
			float64(mem.GoSys)/(1<<20), float64(mem.HeapSys)/(1<<20))
	}
}

const method = `Method. Each throughput mode gets a fresh quorum queue, pre-filled with
persistent 256-byte messages (unique message ids, publisher confirms, the
same seeded sequence of accounts); the clock runs from connecting until
every message is acked (raw) or committed (naive, idem: the runtime's
Processed counter, polled every millisecond; its acks follow the commit
immediately), or until -cap, when the mode reports the messages done by
then. raw acks each delivery by hand without a database. naive runs
16 goroutines on one consumer channel, each message in its own transaction:
BEGIN; INSERT INTO dedup (message_id) ON CONFLICT DO NOTHING; UPDATE; COMMIT;
ack. idem runs consumer.New with defaults except Prefetch, a handler doing
the UPDATE, and an in-process OpenTelemetry reader (commits, commit time,
batch retries, postponed messages: those that left their batch because
another batch in flight had written their row); idem-ordered adds OrderingKey = account; idem-deferred also
sends the UPDATE through consumer.Defer (pipelined before the commit). After each mode the
sum of balances must have grown by exactly the number of messages recorded
as processed (dedup or inbox rows), and by all of them unless capped.
The latency and memory runs use idem-ordered.
A row's "× naive" and "× raw" compare it with the baseline of its own
round; with -repeat, the targets compare the modes' medians over the rounds
and say how many rounds met them on their own.
CPU seconds during the consume phase come from getrusage (bench) and
/proc/PID/stat: postgres counts this run's backends (by application_name)
and the server's background processes (WAL writer, checkpointer…), not
other clients'; rabbitmq is beam.smp (all of it: the broker is shared);
"other" is the rest of the machine's busy time from /proc/stat (other
agents' load included), and "machine busy" the busy fraction of all cores;
"steal" is the share of the cores' time the hypervisor gave to other virtual
machines (not counted as busy): runs with a high steal are depressed and
noisy.
"core-µs per msg" is (bench + postgres + rabbitmq) CPU per message: what a
mode costs the machine, less sensitive to other load than msg/s. Latency (measured before the throughput modes, so that their write-back
does not land in it): a publisher in this process sends at the
offered rate (after 50 warm-up messages); the handler notes each message's
Message.ReceivedAt (when the runtime took the delivery from the broker) and
sends its UPDATE with a context naming the message; a pgx QueryTracer on the
consumer's pool notes the message on the UPDATE's connection and stamps the
noted messages when a COMMIT on that connection returns without error
(a ROLLBACK or the next BEGIN forgets them). publish → commit is that stamp
minus the time taken just before the publish call, on the same monotonic
clock: the moment the consumer knows the message is durable, before its
ack. Two baselines run at the same rate, in segments that alternate with
idem's (so that a drift or a stall of the machine reaches all three): a
plain consumer of a fresh quorum queue (manual ack, no database) stamps
each delivery, and the naive consumer (one goroutine) stamps each message
when its transaction committed; publish → delivery is what the broker and
the machine cost before any consumer work; publish → received is the same path under idem,
and received → commit is what idem itself adds. Memory: a child process (this binary) consumes a pre-filled queue with
idem at the given prefetch and reports VmHWM and VmRSS from
/proc/self/status, so neither the publisher nor the other modes count.
`
