package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// env is one test's real database schema, queue and broker channel.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	queue  string
	ch     *amqp.Channel
	url    string
	eff    *testrun.Effects
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool, tables := testdb.Schema(t)
	return &env{t: t, pool: pool, tables: tables, queue: testbroker.Queue(t), ch: testbroker.Channel(t), url: testbroker.URL(),
		eff: testrun.NewEffects(t, pool, tables)}
}

func testLogger() *slog.Logger { return testrun.Logger() }

// config is a Config for the test with small delays.
func (e *env) config() Config {
	return Config{
		AMQPURL:           e.url,
		Name:              "test",
		Pool:              e.pool,
		Queue:             e.queue,
		Tables:            e.tables,
		Logger:            testLogger(),
		RetryBaseDelay:    20 * time.Millisecond,
		RetryMaxDelay:     100 * time.Millisecond,
		ReconnectMaxDelay: 500 * time.Millisecond,
		ShutdownTimeout:   10 * time.Second,
		Workers:           2,
	}
}

// effectHandler records one row in effects per processed message: the
// effect whose count must be exactly one per message id.
func (e *env) effectHandler() Handler {
	return func(ctx context.Context, tx pgx.Tx, m *Message) error { return e.eff.Insert(ctx, tx, m.ID) }
}

// start runs c until the test ends (or the returned stop is called).
func start(t *testing.T, c *Consumer) (stop func()) {
	t.Helper()
	return testrun.Start(t, c.Run)
}

func (e *env) newConsumer(h Handler, edit func(*Config)) *Consumer {
	e.t.Helper()
	cfg := e.config()
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	require.NoError(e.t, err)
	c.Handle(h)
	return c
}

// declare creates the topology before publishing, so nothing is unroutable.
func (e *env) declare(edit func(*Config)) {
	e.t.Helper()
	c := e.newConsumer(e.effectHandler(), edit)
	require.NoError(e.t, c.Declare(context.Background()))
}

func (e *env) publish(id string, body string, headers amqp.Table) {
	e.t.Helper()
	require.NoError(e.t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), ContentType: "application/json", Headers: headers, DeliveryMode: amqp.Persistent,
	}))
}

// effects returns the number of effect rows per message id.
func (e *env) effects() map[string]int { return e.eff.Counts() }

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// drain takes every message currently in queue q (auto-ack).
func (e *env) drain(q string) []amqp.Delivery {
	e.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := e.ch.Get(q, true)
		require.NoError(e.t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testrun.WaitFor(t, timeout, what, cond)
}

// settled is how many messages c has finished with for good.
func settled(c *Consumer) int64 {
	s := c.Stats()
	return s.Processed + s.Duplicates + s.DeadLettered
}
