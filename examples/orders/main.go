// Command orders keeps an order overview projection from a RabbitMQ stream
// of order events, sends a "shipped" e-mail through idem's ledger, and
// exposes idem's replay runner next to its worker, so the projection can be
// rebuilt, audited or repaired from the stream.
//
//	go run ./examples/orders publish -n 20000 [-dup 0.03] [-swap 0.01] [-seed 1] [-skip 0]
//	go run ./examples/orders mailstub [-addr 127.0.0.1:8025]
//	go run ./examples/orders worker [-health-addr 127.0.0.1:8081]
//	go run ./examples/orders replay --mode rebuild|forensic|repair|normal [--from …] [--to …] [--order o-1,o-2]
//
// A rebuild runs online, beside running workers: it builds a shadow of
// order_overview, catches up with the workers and swaps it in, readers
// never seeing the table missing or partial (--in-place rebuilds in place,
// the workers paused; --abandon --run-id ID gives up an interrupted one).
//
// Global flags, before the command: -schema (default orders), -stream
// (default orders.events) and -mail (where the e-mails go, default
// http://127.0.0.1:8025/send). Events are JSON, published over AMQP 0-9-1
// to the stream with the message-id and timestamp set:
//
//	{"orderId":"o-17","version":2,"type":"OrderPaid"}
//
// IDEM_PG_URL and IDEM_AMQP_URL (and IDEM_STREAM_URL, when the stream port
// is not the AMQP host's 5552) say where PostgreSQL and RabbitMQ are; for a
// RabbitMQ cluster, IDEM_AMQP_URL (or -amqp-url) lists its nodes' URLs,
// comma-separated.
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
	"github.com/idemkit/idem/replay"
	"github.com/idemkit/idem/replay/replaycmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "orders:", err)
	}
	os.Exit(replaycmd.ExitCode(err))
}

// options are the settings every command shares.
type options struct {
	pgURL, schema, stream, mailURL string
	amqpURL                        string // one URL, or a cluster's node URLs separated by commas
	streamURL                      string // default: derived from amqpURL, or IDEM_STREAM_URL
	healthAddr                     string // worker: where the probes are served
	logger                         *slog.Logger
}

const usage = "usage: orders [-schema orders] [-stream orders.events] [-mail URL] publish|mailstub|worker|replay [flags]"

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	o := options{pgURL: env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		logger:  slog.New(slog.NewTextHandler(os.Stderr, nil))}
	fs.StringVar(&o.schema, "schema", "orders", "schema for idem's tables and the projection")
	fs.StringVar(&o.stream, "stream", "orders.events", "the stream of order events")
	fs.StringVar(&o.mailURL, "mail", "http://127.0.0.1:8025/send", "where the shipped e-mails are sent (see mailstub)")
	fs.Var(secretURL{&o.amqpURL}, "amqp-url", "RabbitMQ `URL`, or a cluster's node URLs separated by commas ($IDEM_AMQP_URL sets the default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := amqpnodes.Split(o.amqpURL); err != nil {
		return err
	}
	args = fs.Args()
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "publish":
		return publishCommand(ctx, o, args[1:])
	case "mailstub":
		return mailstubCommand(ctx, o, args[1:])
	case "worker":
		return workerCommand(ctx, o, args[1:])
	case "replay":
		return replayCommand(ctx, o, args[1:])
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

// replayCommand is idem's replay runner on the worker's consumer: the
// binary adds the projection's declaration, for a rebuild beside the
// running workers, and how to reset it for a rebuild in place.
func replayCommand(ctx context.Context, o options, args []string) error {
	pool, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	overview, err := newOverview(o)
	if err != nil {
		return err
	}
	c, err := newConsumer(o, pool, overview)
	if err != nil {
		return err
	}
	return replaycmd.Main(ctx, c, args, replaycmd.Command{
		Options: replay.Options{Projection: overview, Reset: resetProjection(o)},
		KeyFlag: "order",
	})
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
