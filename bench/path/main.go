// Command path measures which library files one new queue message runs on
// its success path: the broker's delivery, the handler, the commit, the ack
// and the count in Stats. It is the number to watch when the engine is split
// by stage of the flow (STYLE.md): a reader follows one message through these
// files, and every station is a room they enter.
//
// It must run as a binary built with coverage of the whole module:
//
//	go build -cover -covermode=atomic -coverpkg=github.com/idemkit/idem/... -o /tmp/path ./bench/path
//	/tmp/path [-rounds 3] [-warmups 2] [-grace 30ms] [-quiet 300ms] [-timeout 30s] [-out DIR] [-max-stations N]
//
// or `make path`, which does both. It runs from the module root, whose
// sources name the functions of the blocks it reports.
//
// On a fresh schema and a fresh quorum queue it starts a consumer
// (consumer.New, a handler that makes one insert with tx.Exec), lets
// -warmups messages through, then for each of -rounds rounds clears the
// coverage counters (runtime/coverage.ClearCounters), publishes one new
// persistent message, polls Stats until the message is counted as processed
// (which happens after its ack), waits -grace and writes the counters
// (runtime/coverage.WriteCountersDir). Each round is followed by a control
// round as long, polling Stats the same way, with no message. The message's
// path is the set of coverage blocks hit in every message round and in no
// control round: what the background (heartbeats, health probes) and the
// polling itself run cancels out.
//
// It prints every library file on that path (not tests, bench/, examples/
// or cmd/) with the functions it ran there, and counts the stations: the
// files of the runtime packages consumer (with its queue source),
// internal/engine and inbox. The others (the root package's value types,
// leaf utilities such as internal/sqltext and internal/amqpconn) are listed
// as helpers and not counted.
//
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ are. The
// schema and the queues are dropped at the end, also after a failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/coverage"
	"syscall"
	"time"
)

// buildHint says how the binary must be built, for the errors of a binary
// built otherwise.
const buildHint = "build with go build -cover -covermode=atomic -coverpkg=github.com/idemkit/idem/..., as make path does"

// options are the command-line flags.
type options struct {
	pgURL, amqpURL string
	rounds         int           // message rounds, each with its control round
	warmups        int           // messages processed before the first round
	grace          time.Duration // wait after the message settled, before writing the counters
	quiet          time.Duration // pause before each round, for the previous one's tail to end
	timeout        time.Duration // longest wait for one message to settle
	out            string        // where the counter snapshots go; empty: a temporary directory, removed
	goCmd          string        // the go command, for go tool covdata
	maxStations    int           // fail above this many stations; 0: no limit
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench/path:", err)
		os.Exit(1)
	}
}

// run measures the path and prints it.
func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	// Fails at once in a binary built without atomic coverage.
	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("coverage counters: %w (%s)", err, buildHint)
	}
	out := o.out
	if out == "" {
		if out, err = os.MkdirTemp("", "bench-path-"); err != nil {
			return fmt.Errorf("counter directory: %w", err)
		}
		defer os.RemoveAll(out)
	}
	r, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer r.cleanup()
	snaps, err := r.measure(ctx, out)
	if err != nil {
		return err
	}
	p, err := trace(ctx, o.goCmd, snaps)
	if err != nil {
		return err
	}
	p.print(os.Stdout)
	if n := p.stations(); o.maxStations > 0 && n > o.maxStations {
		return fmt.Errorf("the path runs %d stations, more than -max-stations %d: see the engine's package doc", n, o.maxStations)
	}
	return nil
}

// parse reads the flags and the environment.
func parse(args []string) (options, error) {
	o := options{
		pgURL:   env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
	}
	fs := flag.NewFlagSet("bench/path", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 3, "message rounds, each followed by a control round without a message")
	fs.IntVar(&o.warmups, "warmups", 2, "messages processed before the first round")
	fs.DurationVar(&o.grace, "grace", 30*time.Millisecond, "wait after the message is counted, before writing the counters")
	fs.DurationVar(&o.quiet, "quiet", 300*time.Millisecond, "pause before each round")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "longest wait for a message to be counted")
	fs.StringVar(&o.out, "out", "", "keep the counter snapshots in this directory (default: a temporary one, removed)")
	fs.StringVar(&o.goCmd, "go", "go", "the go command that runs go tool covdata")
	fs.IntVar(&o.maxStations, "max-stations", 0, "fail when the path runs more stations than this (0: no limit)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.rounds <= 0 || o.warmups < 0 || o.grace < 0 || o.quiet < 0 || o.timeout <= 0 {
		return o, errors.New("-rounds and -timeout must be positive, -warmups, -grace and -quiet not negative")
	}
	return o, nil
}

// env returns the environment variable key, or def when it is empty.
func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
