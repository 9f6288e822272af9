package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// BenchmarkRecordEffectOverhead measures what recording one ledger effect
// per message costs the runtime (the target: at most 15% less throughput). In
// the same run it drains b.N pre-published capture requests through the
// consumer with two handlers, each time on a fresh queue and schema: the
// baseline only inserts the payment row; the other is the worker's handler,
// which also records the capture effect (the dispatcher is not running).
// The two alternate over four drains (A B B A) so that a change in machine
// load during the run weighs on both. ratio is with-effect throughput over
// baseline throughput. Run with a fixed count, e.g. -benchtime 10000x.
func BenchmarkRecordEffectOverhead(b *testing.B) {
	n := b.N
	b.StopTimer()
	var baseline, recorded time.Duration
	for _, record := range []bool{false, true, true, false} {
		d := drainThroughput(b, n, record)
		if record {
			recorded += d
		} else {
			baseline += d
		}
	}
	b.ReportMetric(float64(2*n)/baseline.Seconds(), "baseline_msg/s")
	b.ReportMetric(float64(2*n)/recorded.Seconds(), "with_effect_msg/s")
	b.ReportMetric(baseline.Seconds()/recorded.Seconds(), "ratio")
}

// drainThroughput publishes n capture requests, then measures how long the
// consumer takes to process them all, recording a capture effect per
// message when record is true.
func drainThroughput(b *testing.B, n int, record bool) time.Duration {
	b.Helper()
	ctx := context.Background()
	pool, tables := testdb.Schema(b)
	require.NoError(b, createTables(ctx, pool, tables))
	queue := testbroker.Queue(b)
	quiet := slog.New(slog.DiscardHandler)
	h, err := newCaptureHandler(tables, "http://127.0.0.1:1", quiet)
	require.NoError(b, err)
	handler := h.handle
	if !record {
		handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, _, err := h.insertPayment(ctx, tx, m)
			return err
		}
	}
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: consumerName, Pool: pool,
		Queue: queue, Tables: tables, Logger: quiet})
	require.NoError(b, err)
	c.Handle(handler)
	require.NoError(b, c.Declare(ctx))
	_, err = publish(ctx, publishConfig{amqpURL: testbroker.URL(), queue: queue, n: n})
	require.NoError(b, err)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- c.Run(runCtx) }()
	for c.Stats().Processed < int64(n) {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	require.NoError(b, <-done)

	var payments, effects int
	require.NoError(b, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+paymentsTable(tables)+`), (SELECT count(*) FROM `+
		tables.Table("ledger")+`)`).Scan(&payments, &effects))
	require.Equal(b, n, payments)
	if record {
		require.Equal(b, n, effects)
	} else {
		require.Zero(b, effects)
	}
	return elapsed
}
