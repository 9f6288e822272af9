package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// Settings of the liveness workers the soak starts. A short handler timeout
// and few attempts keep a hung message's way to the dead letters within a
// small run: two timeouts, the second after a retry delay.
const (
	livenessHandlerTimeout = 2 * time.Second
	livenessMaxAttempts    = 2
	livenessRetryDelay     = 250 * time.Millisecond
)

// runWorker is `soak worker`: the liveness worker (package soakworker), which
// the soak starts as a process of its own.
func runWorker(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := soakworker.Config{
		PGURL:  envOr("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		Logger: slog.New(slog.NewTextHandler(stderr, nil)),
	}
	amqpURL := fs.String("amqp-url", envOr("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		"RabbitMQ URL, or a cluster's node URLs separated by commas (default: $IDEM_AMQP_URL)")
	fs.StringVar(&cfg.Queue, "queue", "soak.liveness", "queue to consume")
	fs.StringVar(&cfg.Schema, "schema", "soak_liveness", "schema for idem's tables, the balances and the applied log")
	fs.StringVar(&cfg.Tag, "tag", "liveness", "this process's name in the applied log")
	fs.DurationVar(&cfg.HandlerTimeout, "handler-timeout", livenessHandlerTimeout, "consumer.Config.HandlerTimeout")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", livenessMaxAttempts, "consumer.Config.MaxAttempts")
	fs.DurationVar(&cfg.RetryBaseDelay, "retry-base-delay", livenessRetryDelay, "consumer.Config.RetryBaseDelay")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitPass
		}
		return exitNotRun
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "soak worker: unexpected arguments %q\n", fs.Args())
		return exitNotRun
	}
	var err error
	if cfg.AMQPURLs, err = amqpnodes.Split(*amqpURL); err != nil {
		fmt.Fprintln(stderr, "soak worker: -amqp-url:", err)
		return exitNotRun
	}
	err = soakworker.Run(ctx, cfg)
	if err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
		fmt.Fprintln(stderr, "soak worker:", err)
		return exitFail
	}
	return exitPass // run to its end, or asked to stop (SIGTERM) before it was up
}
