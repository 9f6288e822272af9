package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testbroker"
	"github.com/idemkit/idem/internal/testdb"
)

// env is one test's real database schema, queue and broker channel.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	queue  string
	ch     *amqp.Channel
	url    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool, tables := testdb.Schema(t)
	e := &env{t: t, pool: pool, tables: tables, queue: testbroker.Queue(t), ch: testbroker.Channel(t), url: testbroker.URL()}
	_, err := pool.Exec(context.Background(), fmt.Sprintf(
		`CREATE TABLE %s.effects (message_id text NOT NULL, seq bigserial, note text NOT NULL DEFAULT '')`, tables.QuotedSchema()))
	require.NoError(t, err)
	return e
}

func testLogger() *slog.Logger {
	if os.Getenv("IDEM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

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
	return func(ctx context.Context, tx pgx.Tx, m *Message) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.effects (message_id) VALUES ($1)`, e.tables.QuotedSchema()), m.ID)
		return err
	}
}

// start runs c until the test ends (or the returned stop is called).
func start(t *testing.T, c *Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("consumer did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
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
	require.NoError(e.t, c.declare(e.ch))
}

func (e *env) publish(id string, body string, headers amqp.Table) {
	e.t.Helper()
	require.NoError(e.t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), ContentType: "application/json", Headers: headers, DeliveryMode: amqp.Persistent,
	}))
}

// effects returns the number of effect rows per message id.
func (e *env) effects() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), fmt.Sprintf(`SELECT message_id, count(*) FROM %s.effects GROUP BY 1`, e.tables.QuotedSchema()))
	require.NoError(e.t, err)
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(e.t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(e.t, rows.Err())
	return out
}

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
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settled is how many messages c has finished with for good.
func settled(c *Consumer) int64 {
	s := c.Stats()
	return s.Processed + s.Duplicates + s.DeadLettered
}
