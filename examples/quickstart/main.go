// Command quickstart is idem's smallest worker: it adds deposits to account
// balances with a plain, deliberately non-idempotent increment, so that only
// idem stands between a redelivered message and a wrong balance.
//
//	go run ./examples/quickstart worker  [-queue quickstart.deposits] [-schema quickstart] [-partitions 8] [-health-addr 127.0.0.1:8081]
//	go run ./examples/quickstart publish [-n 10000] [-dup 0.3] [-partitions 8] [-run NAME]
//	go run ./examples/quickstart demo    [-n 10000] [-dup 0.3]
//
// Messages are JSON {"account":"A1","amount":5} with the AMQP message-id set.
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ are; for a
// RabbitMQ cluster, IDEM_AMQP_URL (or -amqp-url) lists its nodes' URLs,
// comma-separated, and the worker keeps consuming through the others when
// the node it uses goes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/amqpnodes"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

const usage = "usage: quickstart worker|publish|demo [flags]; quickstart COMMAND -h lists the flags"

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println(usage)
		return nil
	}
	fs := flag.NewFlagSet("quickstart "+args[0], flag.ContinueOnError)
	o := options{pgURL: env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable")}
	amqpURL := env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	fs.Var(secretURL{&amqpURL}, "amqp-url", "RabbitMQ `URL`, or a cluster's node URLs separated by commas ($IDEM_AMQP_URL sets the default)")
	fs.StringVar(&o.queue, "queue", "quickstart.deposits", "queue to consume / publish to")
	fs.IntVar(&o.partitions, "partitions", 0, "partitions of the queue (consumer.Config.Partitions): one account's deposits stay in order across worker processes")
	fs.StringVar(&o.schema, "schema", "quickstart", "schema for idem's tables and the balances")
	fs.IntVar(&o.n, "n", 10000, "deposits to publish")
	fs.Float64Var(&o.dup, "dup", 0.3, "fraction of deposits published a second time (same id and body)")
	fs.IntVar(&o.accounts, "accounts", 20, "number of accounts")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "worker: serve Prometheus metrics at http://ADDR/metrics (default: off)")
	fs.StringVar(&o.healthAddr, "health-addr", "", "worker: serve GET /healthz and /readyz on this address (e.g. 127.0.0.1:8081)")
	fs.StringVar(&o.run, "run", "", "publish: the run's name, from which its deposits' ids and amounts derive; publishing again with the same -run sends the same deposits, applied once (default: a random name, logged)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var err error
	if o.amqpURLs, err = amqpnodes.Split(amqpURL); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch args[0] {
	case "worker":
		return worker(ctx, o, logger)
	case "publish":
		_, err := publish(ctx, o, logger)
		return err
	case "demo":
		return demo(ctx, o, logger)
	default:
		return fmt.Errorf("unknown command %q: want worker, publish or demo", args[0])
	}
}

type options struct {
	pgURL, queue, schema    string
	amqpURLs                []string // the broker's nodes
	metricsAddr             string
	healthAddr              string
	run                     string // publish: the run's name (see publish)
	n, accounts, partitions int
	dup                     float64
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// secretURL is a flag holding a URL, or a list of URLs, that may carry a
// password: its default shows in -h and in the usage text of a mistyped
// flag, which may land in a container's logs, so it shows redacted.
type secretURL struct{ p *string }

func (f secretURL) String() string {
	if f.p == nil {
		return ""
	}
	return amqpnodes.Redact(*f.p)
}

func (f secretURL) Set(s string) error { *f.p = s; return nil }
