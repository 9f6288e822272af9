package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/ledger"
)

// env is one test's schema, queue, gateway and running worker.
type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	tables  idem.Tables
	queue   string
	ch      *amqp.Channel
	gateway *gateway
	ledger  *ledger.Ledger
	worker  *worker
	// traceparents holds the traceparent header of every gateway request.
	traceparents chan string
}

// newEnv starts a gateway with faults f and a worker calling it through
// client (nil: the worker's default), both stopped when the test ends. tune,
// when set, adjusts the dispatcher after the test defaults.
func newEnv(t *testing.T, f faults, client *http.Client, tune func(*ledger.DispatcherConfig)) *env {
	t.Helper()
	ctx := context.Background()
	pool, tables := testdb.Schema(t)
	require.NoError(t, createTables(ctx, pool, tables))
	e := &env{t: t, pool: pool, tables: tables, queue: testbroker.Queue(t), ch: testbroker.Channel(t),
		gateway: newGateway(f, testLogger()), traceparents: make(chan string, 1000)}
	gw := e.gateway.handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case e.traceparents <- r.Header.Get("traceparent"):
		default:
		}
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var err error
	e.ledger, err = ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	e.worker, err = newWorker(workerConfig{
		pool: pool, tables: tables, amqpURL: testbroker.URL(), queue: e.queue,
		gatewayURL: srv.URL, client: client, logger: testLogger(),
		tuneConsumer: fastConsumer,
		tuneDispatcher: func(d *ledger.DispatcherConfig) {
			fastDispatcher(d)
			if tune != nil {
				tune(d)
			}
		},
	})
	require.NoError(t, err)
	require.NoError(t, e.worker.consumer.Declare(ctx))
	runUntilCleanup(t, e.worker.run)
	return e
}

func fastConsumer(c *consumer.Config) {
	c.RetryBaseDelay = 20 * time.Millisecond
	c.RetryMaxDelay = 100 * time.Millisecond
	c.ReconnectMaxDelay = 500 * time.Millisecond
	c.ShutdownTimeout = 10 * time.Second
	c.Workers = 2
}

func fastDispatcher(d *ledger.DispatcherConfig) {
	d.PollInterval = 50 * time.Millisecond
	d.RetryBackoff = 5 * time.Millisecond
	d.RetryBackoffMax = 50 * time.Millisecond
}

// runUntilCleanup runs fn until the test ends, then cancels it and requires
// that it stops, without error, within 30 seconds.
func runUntilCleanup(t *testing.T, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop within 30s of cancellation")
		}
	})
}

func testLogger() *slog.Logger { return testrun.Logger() }

// body is a valid capture request body.
func body(captureRequestID string, amount int) string {
	return fmt.Sprintf(`{"schemaVersion":1,"captureRequestId":%q,"orderId":"o-1","amount":%d,"currency":"EUR"}`, captureRequestID, amount)
}

// publish sends one message to the test's queue.
func (e *env) publish(id, correlationID, body string) {
	e.t.Helper()
	require.NoError(e.t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
		MessageId: id, CorrelationId: correlationID, Body: []byte(body),
		ContentType: "application/json", DeliveryMode: amqp.Persistent,
	}))
}

// waitSettled waits until the consumer has settled n messages.
func (e *env) waitSettled(n int64) consumer.Stats {
	e.t.Helper()
	var s consumer.Stats
	waitFor(e.t, "messages settled", func() bool {
		s = e.worker.consumer.Stats()
		return s.Processed+s.Duplicates+s.DeadLettered >= n
	})
	return s
}

// waitEffect waits until the capture effect of captureRequestID is in a
// final status and returns it.
func (e *env) waitEffect(captureRequestID string) ledger.Entry {
	e.t.Helper()
	var entry ledger.Entry
	waitFor(e.t, "capture effect "+captureRequestID+" settled", func() bool {
		var err error
		entry, err = e.ledger.Get(context.Background(), ledger.EffectID(effectCapture, captureRequestID))
		if err != nil {
			return false
		}
		switch entry.Status {
		case ledger.StatusSucceeded, ledger.StatusFailedTerminal, ledger.StatusUnknown:
			return true
		}
		return false
	})
	return entry
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	n, err := count(context.Background(), e.pool, sql, args...)
	require.NoError(e.t, err)
	return n
}

func (e *env) payments() int {
	return e.count(`SELECT count(*) FROM ` + paymentsTable(e.tables))
}

func (e *env) effects() int {
	return e.count(`SELECT count(*) FROM ` + e.tables.Table("ledger"))
}

// deadLetterReason returns the reason stored for message id in the
// dead_letters table ("" when there is no row).
func (e *env) deadLetterReason(id string) string {
	e.t.Helper()
	reasons, err := groupCount[string](context.Background(), e.pool,
		`SELECT reason, count(*) FROM `+e.tables.Table("dead_letters")+` WHERE message_id = $1 GROUP BY reason`, id)
	require.NoError(e.t, err)
	require.LessOrEqual(e.t, len(reasons), 1, "message %s dead-lettered for several reasons: %v", id, reasons)
	for r := range reasons {
		return r
	}
	return ""
}

// dlq waits for n messages in the dead-letter queue and returns their
// x-idem-reason headers by message id.
func (e *env) dlq(n int) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	waitFor(e.t, fmt.Sprintf("%d messages in the dead-letter queue", n), func() bool {
		d, ok, err := e.ch.Get(e.queue+".dlq", true)
		require.NoError(e.t, err)
		if ok {
			reason, _ := d.Headers["x-idem-reason"].(string)
			out[d.MessageId] = reason
		}
		return len(out) >= n
	})
	return out
}

// keys returns the Idempotency-Keys the gateway has charged under.
func (g *gateway) keys() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for k := range g.byKey {
		out = append(out, k)
	}
	return out
}

// waitFor polls cond until it holds, failing the test after 20 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 20*time.Second, what, cond)
}

// waitWithin polls cond until it holds, failing the test after limit.
func waitWithin(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
