// Command soak drives idem's examples end to end and breaks things while they
// run: it builds the quickstart, payments and orders binaries, starts their
// workers (and the payments gateway and the orders mail stub) as processes,
// publishes a load with duplicates, conflicting payloads and malformed
// messages at a steady rate, and meanwhile SIGKILLs workers, closes their
// broker connections, terminates their PostgreSQL sessions, kills the
// payments dispatcher with calls in flight and lets the gateway fail, stall
// and drop answers after charging.
//
// Beside the examples it runs a worker of its own, liveness (`soak worker`,
// package soakworker): deposits on 20 hot accounts without an ordering key,
// with adjacent duplicates, whose handler honours fault markers in the
// payload. The examples stay free of fault hooks; on this workload the soak
// injects the faults that need a misbehaving handler or more processes:
//
//   - hang: two messages whose handlers hang, one in a statement (it
//     honours its context), one in Go code that ignores it. Each is retried
//     and dead-lettered with reason handler_timeout, while the worker goes on.
//   - crash: a message that kills its worker process (os.Exit, or a panic in
//     a goroutine); the soak's supervisor starts the worker again, and idem
//     dead-letters the message as worker_crashed before the broker's delivery
//     limit, and nothing else.
//   - compete: two more processes of the worker, three with one consumer
//     Name on one queue, for 15s.
//
// And one fault goes through the operator's doors, with the built idem
// command line and the orders binary's replay subcommand, while the load
// and the other faults go on:
//
//   - retention: idem inbox cleanup at the floor W on every example
//     (--older-than W --floor W), then a normal replay of the orders stream
//     from first, which must be refused naming the horizon, one from just
//     above the horizon to the tail, which must process nothing the live
//     consumer had, and idem deadletters redrive of the quickstart and
//     payments dead letters, which must leave in the dead-letter queue
//     every message that entered it by the horizon and move the others.
//     W is the longest gap between two copies of a message in the load plus
//     15s for redeliveries (about 20s in make soak): a cleanup below the
//     time after which the soak may still deliver a copy would break the
//     retention contract by design. The cleanup comes once rows older than
//     W exist; the queues' load opens with a malformed message, so that
//     their dead-letter queues hold one older than any horizon. The soak
//     remembers every row the cleanup deleted, and fails when one of their
//     messages is claimed again.
//
// Two more faults break the production topology of scripts/cluster.sh (a
// 3-node RabbitMQ cluster, a PostgreSQL primary with a streaming standby),
// and only it: the soak refuses them unless IDEM_AMQP_URL, IDEM_STREAM_URL
// and IDEM_PG_URL name its nodes (the IDEM_CLUSTER_* URLs that
// scripts/cluster.sh env prints) and every part of it is up. make
// soak-cluster runs them.
//
//   - node: kill -9 of a RabbitMQ node the workers are connected to (the
//     one killed the fewest times), started again 5s later; one node down
//     at a time, so that a majority always serves. The workers, given every
//     node, dial the others; so does the soak's publisher, which publishes
//     again what its lost connection left unconfirmed.
//   - pgfailover: the primary stopped at once and the standby promoted
//     (scripts/cluster.sh pg-failover); 5s later the old primary rejoins
//     as a standby (pg-rejoin). The workers follow through the multi-host
//     URL (target_session_attrs=read-write). It needs synchronous
//     replication (scripts/cluster.sh pg-mode sync, or up --sync): with
//     asynchronous replication a failover loses acked writes by design,
//     and the soak refuses to run it.
//
// The run does not settle before the node killed runs again and the old
// primary is a synchronous standby again; with these faults, rabbitmqctl
// runs through scripts/cluster.sh on a node that is up.
//
// When everything has settled it checks that every valid message took effect
// exactly once and every bad one is in the dead letters with its reason (and
// no healthy one, nor any the broker dead-lettered at its delivery limit),
// prints a table and exits non-zero on FAIL.
//
//	go run ./internal/testkit/soak [-n 2000] [-rate 60] [-dup 0.2] [-conflict 0.01] [-malformed 0.01]
//	                       [-faults kill,connections,backends,dispatcher,gateway,hang,crash,compete,retention] [-fault-every 4s]
//	                       [-duration-cap 2m] [-examples quickstart,payments,orders,liveness] [-seed N] [-json FILE]
//	                       [-amqp-url URL[,URL...]]
//	go run ./internal/testkit/soak -faults node,pgfailover,kill,connections -examples quickstart,payments,liveness -duration-cap 3m
//	go run ./internal/testkit/soak worker [-queue Q] [-schema S] [-tag T] [-handler-timeout 2s] [-max-attempts 2] [-amqp-url URL[,URL...]]
//
// Every run uses its own schemas, queues and stream (named after a random run
// id) and removes them at the end (-keep leaves them, and the worker logs,
// for inspection). IDEM_PG_URL, IDEM_AMQP_URL (or -amqp-url) and
// IDEM_STREAM_URL say where PostgreSQL and RabbitMQ are; for a cluster,
// IDEM_AMQP_URL lists its nodes' URLs separated by commas, IDEM_STREAM_URL
// their stream URLs likewise (derived from IDEM_AMQP_URL's when unset), and
// IDEM_PG_URL may list a primary and its standbys with
// target_session_attrs=read-write. The soak hands them to every process it
// starts, and logs them with their passwords hidden. rabbitmqctl and ss must
// be runnable (as root, or with -rabbitmqctl "docker exec rabbit
// rabbitmqctl").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/streamio"
)

// Exit codes.
const (
	exitPass   = 0
	exitFail   = 1 // an invariant was violated
	exitNotRun = 2 // the soak could not run (bad flags, services, build)
)

// config is what one soak run does.
type config struct {
	n           int           // valid messages, split between the examples
	rate        float64       // messages per second, copies and bad ones included
	dup         float64       // share of valid messages sent again (same id; payments: half as producer retries)
	conflict    float64       // share of valid messages whose id comes again with another payload
	malformed   float64       // share of extra messages that can never be processed
	faults      []string      // enabled faults, from allFaults
	faultEvery  time.Duration // mean time between faults
	durationCap time.Duration // the whole run, publishing and settling, must end within it
	examples    []example
	seed        uint64
	jsonFile    string
	keep        bool
	rabbitmqctl []string

	pgURL     string    // one host, or a primary and its standbys (target_session_attrs=read-write)
	amqpURLs  []string  // the broker's nodes
	streamURL string    // the stream protocol URI of each node, comma-separated
	logOut    io.Writer // progress lines
}

// allFaults are the faults -faults can enable.
var allFaults = []string{faultKill, faultConnections, faultBackends, faultDispatcher, faultGateway, faultHang, faultCrash, faultCompete, faultRetention,
	faultNode, faultPGFailover, faultFreeze}

// defaultFaults are the faults a run injects without -faults: all but the
// cluster faults, which need scripts/cluster.sh's topology.
var defaultFaults = slices.DeleteFunc(slices.Clone(allFaults), isClusterFault)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses args, runs the soak and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runWorker(ctx, args[1:], stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitPass
	}
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return exitNotRun
	}
	rep, err := soak(ctx, cfg)
	if rep != nil {
		rep.print(stdout)
		if cfg.jsonFile != "" {
			if werr := rep.writeJSON(cfg.jsonFile); werr != nil {
				fmt.Fprintln(stderr, "soak:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return exitNotRun
	}
	if !rep.Pass {
		return exitFail
	}
	return exitPass
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{
		pgURL:  envOr("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		logOut: stderr,
	}
	amqpURL := fs.String("amqp-url", envOr("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		"RabbitMQ URL, or a cluster's node URLs separated by commas (default: $IDEM_AMQP_URL); the stream URLs are $IDEM_STREAM_URL, or derived from these")
	fs.IntVar(&cfg.n, "n", 2000, "valid messages, split evenly between the examples")
	fs.Float64Var(&cfg.rate, "rate", 60, "messages published per second, copies and bad messages included")
	fs.Float64Var(&cfg.dup, "dup", 0.2, "share of valid messages published again (payments: half of them as producer retries under a new id; liveness: right after the original)")
	fs.Float64Var(&cfg.conflict, "conflict", 0.01, "share of valid messages whose id is published again with another payload")
	fs.Float64Var(&cfg.malformed, "malformed", 0.01, "share of additional messages that can never be processed (bad JSON, missing fields, no message id)")
	faults := fs.String("faults", strings.Join(defaultFaults, ","), "faults to inject (any of "+strings.Join(allFaults, ",")+"), or none; "+
		"node and pgfailover need the URLs to point at scripts/cluster.sh's cluster, with synchronous replication for pgfailover")
	fs.DurationVar(&cfg.faultEvery, "fault-every", 4*time.Second, "mean time between two faults")
	fs.DurationVar(&cfg.durationCap, "duration-cap", 2*time.Minute, "publishing and settling must end within this (the build is not counted)")
	examples := fs.String("examples", "quickstart,payments,orders,liveness", "workloads to drive: the examples, and the soak's own liveness worker")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the load and the fault schedule (0: random, printed)")
	fs.StringVar(&cfg.jsonFile, "json", "", "also write the report as JSON to this file")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the schemas, queues, stream and worker logs")
	ctl := fs.String("rabbitmqctl", "rabbitmqctl", "command that runs rabbitmqctl (split on spaces); with the node or pgfailover fault, "+
		"scripts/cluster.sh ctl on a node that is up")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.amqpURLs, err = amqpnodes.Split(*amqpURL); err != nil {
		return cfg, fmt.Errorf("-amqp-url: %w", err)
	}
	if cfg.streamURL = os.Getenv("IDEM_STREAM_URL"); cfg.streamURL == "" {
		if cfg.streamURL, err = streamio.StreamURLs(cfg.amqpURLs); err != nil {
			return cfg, fmt.Errorf("-amqp-url: %w", err)
		}
	}
	cfg.rabbitmqctl = strings.Fields(*ctl)
	for _, name := range splitList(*examples) {
		ex, ok := exampleByName(name)
		if !ok {
			return cfg, fmt.Errorf("-examples: unknown example %q (want quickstart, payments, orders, liveness)", name)
		}
		if !slices.Contains(cfg.examples, ex) {
			cfg.examples = append(cfg.examples, ex)
		}
	}
	if *faults != "none" {
		for _, f := range splitList(*faults) {
			if !slices.Contains(allFaults, f) {
				return cfg, fmt.Errorf("-faults: unknown fault %q (want %s)", f, strings.Join(allFaults, ","))
			}
			if !slices.Contains(cfg.faults, f) {
				cfg.faults = append(cfg.faults, f)
			}
		}
	}
	return cfg, cfg.validate()
}

func (c *config) validate() error {
	switch {
	case len(c.examples) == 0:
		return errors.New("-examples: at least one example is needed")
	case c.n < 10*len(c.examples):
		return fmt.Errorf("-n %d: at least 10 messages per example", c.n)
	case c.rate <= 0:
		return errors.New("-rate must be positive")
	case c.dup < 0 || c.dup > 1 || c.conflict < 0 || c.conflict > 0.5 || c.malformed < 0 || c.malformed > 0.5:
		return errors.New("-dup must be in [0,1], -conflict and -malformed in [0,0.5]")
	case c.faultEvery <= 0 || c.durationCap <= 0:
		return errors.New("-fault-every and -duration-cap must be positive")
	case len(c.rabbitmqctl) == 0:
		return errors.New("-rabbitmqctl is empty")
	}
	if (c.has(faultDispatcher) || c.has(faultGateway)) && !c.runs(payments) {
		return errors.New("-faults dispatcher and gateway need the payments example")
	}
	if (c.has(faultHang) || c.has(faultCrash) || c.has(faultCompete)) && !c.runs(liveness) {
		return errors.New("-faults hang, crash and compete need the liveness workload")
	}
	if c.has(faultRetention) && (!c.runs(orders) || !c.runs(quickstart) && !c.runs(payments)) {
		return errors.New("-faults retention needs the orders example (the replay door) and quickstart or payments (the redrive door)")
	}
	return nil
}

// has reports whether fault f is enabled.
func (c *config) has(f string) bool { return slices.Contains(c.faults, f) }

// runs reports whether example ex is driven.
func (c *config) runs(ex example) bool { return slices.Contains(c.examples, ex) }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
