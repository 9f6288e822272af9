package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/pgnodes"
	"github.com/idemkit/idem/prommetrics"
)

// deposit is the message body.
type deposit struct {
	Account string `json:"account"`
	Amount  *int64 `json:"amount"`
}

// setup connects, migrates idem's tables into the schema and creates the
// balances table.
func setup(ctx context.Context, o options) (*pgxpool.Pool, idem.Tables, error) {
	// pgnodes: a host that stops answering costs seconds (a connect
	// timeout per host of a multi-host URL, TCP keepalives).
	pool, err := pgnodes.New(ctx, o.pgURL)
	if err != nil {
		return nil, idem.Tables{}, fmt.Errorf("connect to postgres: %w", err)
	}
	tables := idem.Tables{Schema: o.schema}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		pool.Close()
		return nil, tables, err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+balancesTable(tables)+` (
		account text PRIMARY KEY,
		balance bigint NOT NULL)`)
	if err != nil {
		pool.Close()
		return nil, tables, fmt.Errorf("create balances: %w", err)
	}
	return pool, tables, nil
}

func balancesTable(t idem.Tables) string { return pgx.Identifier{t.Schema, "balances"}.Sanitize() }

// newConsumer builds the deposit worker.
func newConsumer(o options, pool *pgxpool.Pool, tables idem.Tables, logger *slog.Logger) (*consumer.Consumer, error) {
	c, err := consumer.New(consumer.Config{
		AMQPURLs: o.amqpURLs,
		Name:     "quickstart",
		Pool:     pool,
		Queue:    o.queue,
		// With -partitions, the queue is an exchange in front of that many
		// partition queues, spread over the worker processes: one
		// account's deposits stay in order across processes too.
		Partitions: o.partitions,
		Tables:     tables,
		Logger:     logger,
		// Deposits to one account go to one worker, in order, so batches
		// running in parallel never increment the same row: the deferred
		// increments below never wait for each other's locks.
		OrderingKey: accountOf,
	})
	if err != nil {
		return nil, err
	}
	increment := `INSERT INTO ` + balancesTable(tables) + ` AS b (account, balance) VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET balance = b.balance + EXCLUDED.balance`
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		if d.Account == "" || d.Amount == nil {
			return consumer.DeadLetter("invalid_deposit", errors.New("account and amount are required"))
		}
		// A plain increment: applying it twice would double the deposit.
		// It is write-only, so it is deferred: the batch's increments go to
		// PostgreSQL together, in one round trip just before the commit.
		return consumer.Defer(ctx, tx, increment, d.Account, *d.Amount)
	}))
	return c, nil
}

// accountOf is the ordering key: the deposit's account.
func accountOf(m *consumer.Message) string {
	var d deposit
	_ = json.Unmarshal(m.Body, &d) // an undecodable body is dead-lettered by the handler
	return d.Account
}

// worker runs the consumer until ctx is cancelled, logging counts each second.
func worker(ctx context.Context, o options, logger *slog.Logger) error {
	metrics, err := prommetrics.Serve(o.metricsAddr, logger)
	if err != nil {
		return err
	}
	defer metrics.Close()
	metrics.SetGlobal() // the components below take the global provider
	pool, tables, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := newConsumer(o, pool, tables, logger)
	if err != nil {
		return err
	}
	stopLog := logEverySecond(ctx, c, logger)
	defer stopLog()
	logger.Info("worker started", "queue", o.queue, "schema", o.schema)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	probes := make(chan struct{})
	go func() { // the health probes, until the worker stops
		defer close(probes)
		if o.healthAddr != "" {
			if err := health.ListenAndServe(ctx, o.healthAddr, c); err != nil {
				cancel(err)
			}
		}
	}()
	err = c.Run(ctx)
	cancel(nil)
	<-probes
	if cause := context.Cause(ctx); err == nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	logger.Info("worker stopped", "processed", c.Stats().Processed)
	return err
}

// logEverySecond logs the consumer's counters once a second while they change.
func logEverySecond(ctx context.Context, c *consumer.Consumer, logger *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last consumer.Stats
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s := c.Stats()
				if s != last {
					logger.Info("progress", "processed", s.Processed, "duplicates", s.Duplicates,
						"dead_lettered", s.DeadLettered, "conflicts", s.Conflicts, "retried", s.Retried, "batches", s.Batches)
					last = s
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
