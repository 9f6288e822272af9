package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/projection"
)

func TestMain(m *testing.M) {
	streamio.RouteClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

// env is one test's schema, stream and projection.
type env struct {
	t      testing.TB
	pool   *pgxpool.Pool
	tables idem.Tables
	stream string
	se     *streamio.Env
	ledger *ledger.Ledger
}

// newEnv creates a schema with two projection tables: totals (key → sum,
// what a projection keeps) and applied (one row per handler application,
// which shows any message applied twice), and a stream.
func newEnv(t testing.TB) *env {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	se, err := streamio.Open(ctx, streamio.Config{URI: streamio.URLFromEnv()})
	if err != nil {
		testdb.Unavailable(t, "RabbitMQ stream port", err)
	}
	t.Cleanup(func() { _ = se.Close() })
	e := &env{t: t, pool: pool, tables: tables, stream: testdb.Name(t, "s"), se: se}
	require.NoError(t, se.DeclareStream(ctx, e.stream, streamio.StreamOptions{}))
	t.Cleanup(func() { _ = se.DeleteStream(context.Background(), e.stream) })
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.totals (key text PRIMARY KEY, sum bigint NOT NULL);
		CREATE TABLE %[1]s.applied (message_id text NOT NULL, mode text NOT NULL)`, tables.QuotedSchema()))
	require.NoError(t, err)
	e.ledger, err = ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	return e
}

// event is the test messages' body.
type event struct {
	Key    string `json:"key"`
	N      int64  `json:"n"`
	Fail   bool   `json:"fail,omitempty"`   // the handler returns an error
	Reject bool   `json:"reject,omitempty"` // the handler dead-letters it
	Write  bool   `json:"write,omitempty"`  // the handler writes even in forensic mode
}

func body(ev event) []byte {
	b, _ := json.Marshal(ev)
	return b
}

// msg is message id with event ev, keys cycling over k0…k4.
func msg(i int) streamio.Outgoing {
	return streamio.Outgoing{MessageID: fmt.Sprintf("m-%d", i), Body: body(event{Key: fmt.Sprintf("k%d", i%5), N: int64(i)})}
}

func msgs(from, to int) []streamio.Outgoing {
	var out []streamio.Outgoing
	for i := from; i < to; i++ {
		out = append(out, msg(i))
	}
	return out
}

func (e *env) publish(out ...streamio.Outgoing) {
	e.t.Helper()
	require.NoError(e.t, e.se.Publish(context.Background(), e.stream, out))
}

func testLogger() *slog.Logger { return testrun.Logger() }

// handler is the projection: add n to the key's total, log the
// application, record a "notify" effect per message, and when extra is set,
// a "welcome" effect per key (a feature added after the messages were
// consumed live). In forensic mode it only reads, unless the event says to
// write.
type handler struct {
	e     *env
	extra bool
	// proj, when set, is the projection whose tables the handler writes
	// (through Projection.Table); otherwise it writes the env's tables.
	proj *projection.Projection
	// onApply, when set, runs after each application (tests kill runs here).
	onApply func()
	// fixed makes the handler apply the events it used to reject: the fix
	// deployed before a repair.
	fixed bool
}

// table returns the handler's table name (totals or applied) for SQL in ctx.
func (h *handler) table(ctx context.Context, name string) string {
	if h.proj != nil {
		return h.proj.Table(ctx, name)
	}
	return h.e.tables.QuotedSchema() + "." + name
}

func (h *handler) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev event) error {
	switch {
	case ev.Fail:
		return errors.New("the handler fails on this message")
	case ev.Reject && !h.fixed:
		return consumer.DeadLetter("rejected", errors.New("the handler rejects this message"))
	}
	totals, applied := h.table(ctx, "totals"), h.table(ctx, "applied")
	if idem.ModeFrom(ctx) == idem.Forensic && !ev.Write {
		var sum int64
		err := tx.QueryRow(ctx, `SELECT sum FROM `+totals+` WHERE key = $1`, ev.Key).Scan(&sum)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	} else {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO `+totals+` AS t (key, sum) VALUES ($1, $2)
			ON CONFLICT (key) DO UPDATE SET sum = t.sum + EXCLUDED.sum`, ev.Key, ev.N)
		b.Queue(`INSERT INTO `+applied+` (message_id, mode) VALUES ($1, $2)`, m.ID, string(idem.ModeFrom(ctx)))
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
	}
	_, err := h.e.ledger.Record(ctx, tx, ledger.Effect{Type: "notify", BusinessKey: m.ID, Request: map[string]any{"key": ev.Key, "n": ev.N},
		Target: "http://mail.invalid/send", Consumer: "test", MessageID: m.ID})
	if err != nil {
		return err
	}
	if h.extra {
		if _, err := h.e.ledger.Record(ctx, tx, ledger.Effect{Type: "welcome", BusinessKey: ev.Key, Request: ev.Key,
			Consumer: "test", MessageID: m.ID}); err != nil {
			return err
		}
	}
	if h.onApply != nil {
		h.onApply()
	}
	return nil
}

// consumer returns the test consumer (name "test") of the env's stream.
func (e *env) consumer(h *handler, edit func(*consumer.Config)) *consumer.Consumer {
	e.t.Helper()
	if h == nil {
		h = &handler{e: e}
	}
	cfg := consumer.Config{
		Name: "test", Stream: e.stream, StreamURL: streamio.URLFromEnv(), Topology: consumer.Passive, // newEnv declared it
		Pool: e.pool, Tables: e.tables,
		Logger: testLogger(), RetryBaseDelay: 10 * time.Millisecond, RetryMaxDelay: 50 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second,
		BusinessKey: func(m *consumer.Message) (string, error) {
			var ev event
			_ = json.Unmarshal(m.Body, &ev)
			return ev.Key, nil
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := consumer.New(cfg)
	require.NoError(e.t, err)
	c.Handle(consumer.JSON(h.handle))
	return c
}

// runLive runs c as a live stream worker until its checkpoint reaches last.
func (e *env) runLive(c *consumer.Consumer, last int64) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for e.checkpoint("test") != last {
		if time.Now().After(deadline) {
			cancel()
			e.t.Fatalf("live worker did not reach offset %d (at %d)", last, e.checkpoint("test"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(e.t, err)
	case <-time.After(30 * time.Second):
		e.t.Fatal("live worker did not stop")
	}
}

// startLive runs c as a live stream worker until the returned stop is
// called (also at the end of the test).
func (e *env) startLive(c *consumer.Consumer) (stop func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(e.t, err)
			case <-time.After(30 * time.Second):
				e.t.Error("live worker did not stop")
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// waitCheckpoint waits until scope's checkpoint reaches at least last.
func (e *env) waitCheckpoint(scope string, last int64) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for e.checkpoint(scope) < last {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s did not reach offset %d (at %d)", scope, last, e.checkpoint(scope))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// projection declares the env's tables as the projection "totals".
func (e *env) projection() *projection.Projection {
	e.t.Helper()
	p, err := projection.New(projection.Config{Name: "totals", Schema: e.tables.Schema, Tables: []string{"totals", "applied"}})
	require.NoError(e.t, err)
	return p
}

// checkpoint returns scope's checkpoint of the stream, -1 for none.
func (e *env) checkpoint(scope string) int64 {
	e.t.Helper()
	last, ok, err := store.Checkpoint(context.Background(), e.pool, e.tables, scope, e.stream)
	require.NoError(e.t, err)
	if !ok {
		return -1
	}
	return last
}

// totals returns the projection.
func (e *env) totals() map[string]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT key, sum FROM `+e.tables.QuotedSchema()+`.totals`)
	require.NoError(e.t, err)
	out := map[string]int64{}
	var k string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil })
	require.NoError(e.t, err)
	return out
}

// applied returns how many times each message was applied.
func (e *env) applied() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT message_id, count(*) FROM `+e.tables.QuotedSchema()+`.applied GROUP BY 1`)
	require.NoError(e.t, err)
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	require.NoError(e.t, err)
	return out
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// reset is a rebuild's Reset hook: it empties the projection.
func (e *env) reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `TRUNCATE `+e.tables.QuotedSchema()+`.totals, `+e.tables.QuotedSchema()+`.applied`)
	return err
}

// expectedTotals is the projection of messages from…to-1, each once.
func expectedTotals(from, to int) map[string]int64 {
	out := map[string]int64{}
	for i := from; i < to; i++ {
		out[fmt.Sprintf("k%d", i%5)] += int64(i)
	}
	return out
}

// snapshot returns every table of the schema with its row count and a
// checksum of its rows.
func (e *env) snapshot() map[string]string {
	e.t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, e.tables.Schema)
	require.NoError(e.t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(e.t, err)
	out := map[string]string{}
	for _, name := range names {
		var n int64
		var sum string
		q := `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM ` +
			pgx.Identifier{e.tables.Schema, name}.Sanitize() + ` t`
		require.NoError(e.t, e.pool.QueryRow(ctx, q).Scan(&n, &sum))
		out[name] = fmt.Sprintf("%d rows, md5 %s", n, sum)
	}
	return out
}

// lockedWriter is a concurrency-safe buffer for progress output.
type lockedWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
