package main

import (
	"context"
	"errors"
	"flag"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/prommetrics"
)

func workerCommand(ctx context.Context, o options, args []string) error {
	fs := flag.NewFlagSet("orders worker", flag.ContinueOnError)
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	fs.StringVar(&o.healthAddr, "health-addr", "", "serve GET /healthz and /readyz on this address (e.g. 127.0.0.1:8081)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	metrics, err := prommetrics.Serve(*metricsAddr, o.logger)
	if err != nil {
		return err
	}
	defer metrics.Close()
	metrics.SetGlobal() // the components below take the global provider
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
	o.logger.Info("worker started", "stream", o.stream, "schema", o.schema, "mail", o.mailURL)
	err = runWorker(ctx, o, pool, c)
	s := c.Stats()
	o.logger.Info("worker stopped", "processed", s.Processed, "duplicates", s.Duplicates, "dead_lettered", s.DeadLettered)
	return err
}

// runWorker runs the projection's stream consumer (active, or hot standby
// while another process reads the stream) and the ledger dispatcher that
// sends the e-mails, until ctx is cancelled.
func runWorker(ctx context.Context, o options, pool *pgxpool.Pool, c *consumer.Consumer) error {
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{
		Pool:   pool,
		Tables: idem.Tables{Schema: o.schema},
		Logger: o.logger,
		Executors: map[string]ledger.Executor{
			// The mail service deduplicates by Idempotency-Key, so an
			// attempt whose outcome is unknown may be sent again.
			notifyShipped: &ledger.HTTPExecutor{Client: &http.Client{Timeout: 10 * time.Second}, Deduplicates: true},
		},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var dispatchErr, healthErr error
	wg.Go(func() {
		dispatchErr = d.Run(ctx)
		cancel()
	})
	if o.healthAddr != "" {
		wg.Go(func() {
			healthErr = health.ListenAndServe(ctx, o.healthAddr, d, c)
			cancel()
		})
	}
	err = c.Run(ctx)
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	return errors.Join(dispatchErr, healthErr)
}
