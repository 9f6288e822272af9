// Package testrun holds what idem's own tests of the runtime share: running
// a worker for the duration of a test, waiting for a condition with a
// deadline, a quiet logger, a buffer to read logs from, and an effects table whose rows count how many
// times each message's handler committed.
package testrun

import (
	"bytes"
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
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Logger discards logs unless IDEM_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("IDEM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// LogBuffer holds what a logger wrote, for a test to read; it is safe for
// the logger's concurrent writes.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs run until the test ends or stop is called; stop cancels its
// context and requires run to return nil within 30s.
func Start(t testing.TB, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("worker did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// WaitFor polls cond until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Effects is a table of one row per committed handler run.
type Effects struct {
	t      testing.TB
	pool   *pgxpool.Pool
	insert string
	table  string
}

// NewEffects creates the effects table in tables' schema.
func NewEffects(t testing.TB, pool *pgxpool.Pool, tables idem.Tables) *Effects {
	t.Helper()
	table := tables.QuotedSchema() + ".effects"
	_, err := pool.Exec(context.Background(),
		`CREATE TABLE `+table+` (message_id text NOT NULL, seq bigserial, note text NOT NULL DEFAULT '')`)
	require.NoError(t, err)
	return &Effects{t: t, pool: pool, table: table, insert: `INSERT INTO ` + table + ` (message_id) VALUES ($1)`}
}

// Insert records one effect of message id in tx.
func (e *Effects) Insert(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, e.insert, id)
	return err
}

// Counts returns the number of effect rows per message id.
func (e *Effects) Counts() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), fmt.Sprintf(`SELECT message_id, count(*) FROM %s GROUP BY 1`, e.table))
	require.NoError(e.t, err)
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	require.NoError(e.t, err)
	return out
}

// Table is the effects table's quoted name.
func (e *Effects) Table() string { return e.table }
