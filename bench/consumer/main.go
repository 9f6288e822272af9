// Command consumer measures idem's consumer runtime against two baselines run
// in the same process, on the same machine, against the same broker and
// database:
//
//   - raw: an amqp091 consumer that acks every message by hand and touches no
//     database (the ceiling set by the broker);
//   - naive: the obvious hand-written idempotent consumer, 16 goroutines, one
//     transaction per message (INSERT into a dedup table ON CONFLICT DO
//     NOTHING, UPDATE, COMMIT, ack);
//   - idem, idem-ordered: consumer.New with a handler doing the same UPDATE,
//     without and with an OrderingKey on the account.
//   - idem-deferred: idem-ordered with the UPDATE sent through
//     consumer.Defer, pipelined with the batch's other writes before commit.
//
// Every message is 256 bytes and carries one of -accounts account ids; the
// handler runs `UPDATE accounts SET balance = balance + 1 WHERE id = $1`.
// Each mode pre-publishes -n messages to a fresh quorum queue and is timed
// from connecting until all of them are committed (acked, for raw). A
// latency run, before the modes, offers -latency-rate msg/s to idem for
// -latency-seconds, split into -latency-rounds segments, each after one as
// long for each baseline (a plain consumer without a database, and the naive
// consumer), and reports publish → commit percentiles and, segment by
// segment, their p99 against the broker alone's; after them, a
// child process consumes -n messages with idem at -prefetch to report its
// resident memory. A mode that takes longer than -cap reports the messages
// it finished by then.
//
// With -repeat R the modes run R rounds, interleaved (raw, naive, …, raw,
// naive, …), so that a drift of the machine hits every mode alike; each
// round's ratios compare modes of the same round, and the targets compare
// the modes' medians.
//
//	go run ./bench/consumer [-n 20000] [-repeat 1] [-modes raw,naive,idem,idem-ordered,idem-deferred]
//	    [-latency-rate 200 -latency-seconds 10 -latency-rounds 5] [-prefetch N] [-cap 30s] [-cpuprofile prefix]
//
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ are. The
// run uses a fresh schema and fresh queues, and drops them at the end. The
// results are printed as markdown and written to -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/internal/cpustat"
)

// options are the command-line flags.
type options struct {
	pgURL, amqpURL string
	n              int
	repeat         int
	modes          []string
	accounts       int
	prefetch       int
	naiveWorkers   int
	workers        int
	batchMaxSize   int
	cap            time.Duration
	latencyRate    int
	latencySeconds int
	latencyRounds  int
	memory         bool
	cpuprofile     string
	out            string
	args           string // the command line, for the report

	// child is set in the memory-measuring child process: the queue to consume.
	child       string
	childSchema string
}

var allModes = []string{"raw", "naive", "idem", "idem-ordered", "idem-deferred"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench/consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if o.child != "" {
		return runChild(ctx, o)
	}
	b, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer b.cleanup()
	rep := report{opts: o, machine: b.machine(ctx)}
	// The latency run comes first: it measures a steady 200 msg/s, not a
	// machine still writing back what the throughput modes just wrote (their
	// checkpoint, the broker's segment files).
	if o.latencySeconds > 0 && o.latencyRate > 0 {
		l, err := b.latency(ctx)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		rep.latency = &l
		b.logf("latency      p50 %v  p99 %v  max %v", l.commit.p50, l.commit.p99, l.commit.max)
	}
	for round := 1; round <= o.repeat; round++ {
		for _, mode := range o.modes {
			r, err := b.throughput(ctx, mode)
			if err != nil {
				return fmt.Errorf("%s: %w", mode, err)
			}
			r.round = round
			rep.modes = append(rep.modes, r)
			b.logf("round %d: %-13s %8.0f msg/s  (%d messages in %v, capped: %v)", round, mode, r.rate(), r.n, r.elapsed.Round(time.Millisecond), r.capped)
		}
	}
	if o.memory {
		m, err := b.memory(ctx)
		if err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		rep.memory = &m
		b.logf("memory       VmHWM %d kB  VmRSS %d kB", m.HWMkB, m.RSSkB)
	}
	rep.machine.loadEnd = cpustat.LoadAvg()
	md := rep.markdown()
	fmt.Print("\n" + md)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
			return err
		}
		b.logf("wrote %s", o.out)
	}
	return nil
}

func parse(args []string) (options, error) {
	o := options{
		pgURL:   env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
	}
	fs := flag.NewFlagSet("bench/consumer", flag.ContinueOnError)
	fs.IntVar(&o.n, "n", 20000, "messages per throughput mode")
	fs.IntVar(&o.repeat, "repeat", 1, "rounds of the throughput modes; targets compare the modes' medians")
	modes := fs.String("modes", strings.Join(allModes, ","), "throughput modes to run, in order")
	fs.IntVar(&o.accounts, "accounts", 1000, "number of account rows the messages update")
	fs.IntVar(&o.prefetch, "prefetch", 0, "broker prefetch for every consumer (0: the one idem's default Config gets)")
	fs.IntVar(&o.naiveWorkers, "naive-workers", 16, "goroutines of the naive consumer")
	fs.IntVar(&o.workers, "workers", 0, "idem Config.Workers (0: the runtime's default)")
	fs.IntVar(&o.batchMaxSize, "batch", 0, "idem Config.BatchMaxSize (0: the runtime's default)")
	fs.DurationVar(&o.cap, "cap", 30*time.Second, "longest consume phase per mode; a capped mode reports what it did by then")
	fs.IntVar(&o.latencyRate, "latency-rate", 200, "offered load of the latency run, msg/s (0: skip)")
	fs.IntVar(&o.latencySeconds, "latency-seconds", 10, "seconds of offered load for idem, and as many for each baseline (0: skip)")
	fs.IntVar(&o.latencyRounds, "latency-rounds", 5, "rounds of the latency run, each a segment for the broker alone, the naive consumer and idem, in turn")
	fs.BoolVar(&o.memory, "memory", true, "measure idem's resident memory in a child process")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of each mode's consume phase to PREFIX-MODE.pprof")
	fs.StringVar(&o.out, "out", "/tmp/bench-consumer.md", "also write the markdown report here (empty: don't)")
	fs.StringVar(&o.child, "child-queue", "", "internal: consume this queue as the memory-measuring child")
	fs.StringVar(&o.childSchema, "child-schema", "", "internal: schema of the memory-measuring child")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.args = strings.Join(append([]string{"go run ./bench/consumer"}, args...), " ")
	o.modes = nil
	for _, m := range strings.Split(*modes, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		known := false
		for _, k := range allModes {
			known = known || k == m
		}
		if !known {
			return o, fmt.Errorf("unknown mode %q: want some of %s", m, strings.Join(allModes, ","))
		}
		if slices.Contains(o.modes, m) {
			return o, fmt.Errorf("mode %q listed twice: use -repeat to run the modes again", m)
		}
		o.modes = append(o.modes, m)
	}
	if o.n <= 0 || o.repeat <= 0 || o.accounts <= 0 || o.prefetch < 0 || o.naiveWorkers <= 0 || o.cap <= 0 || o.latencyRounds <= 0 {
		return o, errors.New("-n, -repeat, -accounts, -naive-workers, -cap and -latency-rounds must be positive, -prefetch not negative")
	}
	return o, nil
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
