// Command partitions measures consumer.Config.Partitions: per-key order kept
// across worker processes by a consistent-hash exchange in front of
// -partitions quorum queues with a single active consumer each, spread over
// the processes by PostgreSQL advisory locks. In the same run it measures:
//
//   - throughput: -n events (plus -dup of them published a second time a
//     little later) pre-published to a fresh partitioned consumer, drained
//     by 1 worker process (parts-1), then by -procs processes (parts-n),
//     timed from the moment the lease has spread the partitions over the
//     processes; as baselines, the same events on one queue with
//     OrderingKey, drained by 1 process (queue-1) and by -procs processes
//     (queue-n), which does not keep order across processes;
//   - handover: -procs processes consume events published at -rate per
//     second; after -before one of them is killed with SIGKILL, and the
//     handover of each of its partitions is the time from the kill to the
//     first event of that partition applied by a survivor.
//
// Every event is {account, seq}: the account is the OrderingKey and the
// routing key (partitions.Publish), seq counts the account's events from 1.
// The handler checks the order as it applies an event, in one statement: it
// sets the account's last seq and records a violation when the event does
// not follow the previous one (seq ≠ previous + 1); it records the event
// with the process's label, its partition (Message.Source) and the time.
// Every drain and handover is checked: each event applied once, and the
// events out of order counted; the command fails if an event was lost or
// applied twice, or if a partitioned consumer applied one out of order.
//
//	go run ./bench/partitions [-n 20000] [-accounts 1000] [-dup 0.1] [-partitions 8] [-procs 3] [-repeat 3]
//	    [-modes parts-1,parts-n,queue-1,queue-n] [-rate 2000 -before 3s -after 4s] [-defer] [-cpuprofile prefix]
//
// Each round runs every mode, then the handover, on fresh queues, so that a
// drift of the machine hits all alike; the report gives every drain and the
// medians. Worker processes are this binary, re-executed with -child.
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ are.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cpustat"
	"github.com/idemkit/idem/migrate"
)

// options are the command-line flags.
type options struct {
	pgURL, amqpURL string
	n, accounts    int
	dup            float64
	partitions     int
	procs          int
	repeat         int
	modes          []string
	rate           int
	before, after  time.Duration
	deferred       bool
	cpuprofile     string
	args           string // the command line, for the report

	// Set in a worker process.
	child  string // the queue (and consumer name) to consume
	parts  int    // its partitions, 0 for one queue
	label  string // the name its events are recorded under
	schema string
}

var allModes = []string{"parts-1", "parts-n", "queue-1", "queue-n"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench/partitions:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if o.child != "" {
		return worker(ctx, o)
	}
	return measure(ctx, o)
}

func parse(args []string) (options, error) {
	o := options{
		pgURL:   env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
	}
	fs := flag.NewFlagSet("bench/partitions", flag.ContinueOnError)
	fs.IntVar(&o.n, "n", 20000, "distinct events per throughput drain")
	fs.IntVar(&o.accounts, "accounts", 1000, "accounts (ordering keys) the events belong to")
	fs.Float64Var(&o.dup, "dup", 0.1, "share of events published a second time, about 50 events later")
	fs.IntVar(&o.partitions, "partitions", 8, "Config.Partitions of the partitioned modes")
	fs.IntVar(&o.procs, "procs", 3, "worker processes of the modes ending in -n and of the handover")
	fs.IntVar(&o.repeat, "repeat", 3, "rounds: every mode, then a handover, on fresh queues")
	modes := fs.String("modes", strings.Join(allModes, ","), "throughput modes to run in each round, in order")
	fs.IntVar(&o.rate, "rate", 2000, "events per second offered during the handover run (0: no handover)")
	fs.DurationVar(&o.before, "before", 3*time.Second, "handover: publishing before the kill")
	fs.DurationVar(&o.after, "after", 4*time.Second, "handover: publishing after the kill")
	fs.BoolVar(&o.deferred, "defer", false, "send the handler's statement through consumer.Defer instead of tx.Exec")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "each worker process writes a CPU profile to PREFIX-DRAIN-LABEL.pprof")
	fs.StringVar(&o.child, "child", "", "internal: run as a worker process of this queue")
	fs.IntVar(&o.parts, "child-partitions", 0, "internal: the worker's Config.Partitions")
	fs.StringVar(&o.label, "label", "", "internal: the worker's label")
	fs.StringVar(&o.schema, "schema", "", "internal: the worker's schema")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.args = strings.Join(append([]string{"go run ./bench/partitions"}, args...), " ")
	for _, m := range strings.Split(*modes, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if !slices.Contains(allModes, m) {
			return o, fmt.Errorf("unknown mode %q: want some of %s", m, strings.Join(allModes, ","))
		}
		if slices.Contains(o.modes, m) {
			return o, fmt.Errorf("mode %q listed twice: use -repeat", m)
		}
		o.modes = append(o.modes, m)
	}
	if o.n <= 0 || o.accounts <= 0 || o.partitions <= 0 || o.procs < 2 || o.repeat <= 0 || o.rate < 0 || o.dup < 0 || o.dup >= 1 {
		return o, errors.New("-n, -accounts, -partitions and -repeat must be positive, -procs at least 2, -rate not negative, -dup in [0, 1)")
	}
	return o, nil
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// bench is what the drains of a run share.
type bench struct {
	o      options
	runID  string
	pool   *pgxpool.Pool
	tables idem.Tables
}

// measure runs the rounds and prints the report.
func measure(ctx context.Context, o options) error {
	var id [4]byte
	_, _ = rand.Read(id[:])
	b := &bench{o: o, runID: hex.EncodeToString(id[:])}
	b.tables = idem.Tables{Schema: "bench_partitions_" + b.runID}
	var err error
	if b.pool, err = pgxpool.New(ctx, o.pgURL); err != nil {
		return err
	}
	defer b.pool.Close()
	if _, err := migrate.Up(ctx, b.pool, b.tables); err != nil {
		return err
	}
	defer b.pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+b.tables.QuotedSchema()+" CASCADE") //nolint:errcheck // best effort
	if err := b.createTables(ctx); err != nil {
		return err
	}
	logf("run %s: %d events (+%.0f%% duplicates) on %d accounts, %d partitions, %d processes, %d rounds",
		b.runID, o.n, 100*o.dup, o.accounts, o.partitions, o.procs, o.repeat)
	rep := report{o: o, loadStart: cpustat.LoadAvg()}
	for round := 1; round <= o.repeat; round++ {
		for _, mode := range o.modes {
			d, err := b.drain(ctx, mode, round)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, mode, err)
			}
			logf("round %d: %-8s %7.0f events/s, %d applied once of %d, %d out of order, per process %v",
				round, mode, d.rate(), d.once, o.n, d.violations, d.perLabel)
			rep.drains = append(rep.drains, d)
		}
		if o.rate > 0 {
			h, err := b.handover(ctx, round)
			if err != nil {
				return fmt.Errorf("round %d, handover: %w", round, err)
			}
			logf("round %d: handover %v (max), %d applied once of %d, %d out of order",
				round, h.max().Round(time.Millisecond), h.once, h.events, h.violations)
			rep.handovers = append(rep.handovers, h)
		}
	}
	rep.loadEnd = cpustat.LoadAvg()
	fmt.Print(rep.markdown())
	return rep.failures()
}

// createTables creates the handler's tables: each account's last seq (and
// the one before, set by the same UPDATE), the events out of order, and
// every event applied.
func (b *bench) createTables(ctx context.Context) error {
	s := b.tables.QuotedSchema()
	_, err := b.pool.Exec(ctx, `
		CREATE TABLE `+s+`.last_seq (account int PRIMARY KEY, seq int NOT NULL, prev int NOT NULL);
		CREATE TABLE `+s+`.violations (account int NOT NULL, seq int NOT NULL, after int NOT NULL);
		CREATE TABLE `+s+`.applied (message_id text NOT NULL, label text NOT NULL, part text NOT NULL,
			redelivered bool NOT NULL, at timestamptz NOT NULL)`)
	return err
}

// resetTables empties the handler's tables before a drain.
func (b *bench) resetTables(ctx context.Context) error {
	s := b.tables.QuotedSchema()
	_, err := b.pool.Exec(ctx, `TRUNCATE `+s+`.last_seq, `+s+`.violations, `+s+`.applied;
		INSERT INTO `+s+`.last_seq SELECT g, 0, 0 FROM generate_series(0, `+fmt.Sprint(b.o.accounts-1)+`) g`)
	return err
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
