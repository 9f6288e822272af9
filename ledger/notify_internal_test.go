package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

type succeed struct{}

func (succeed) Execute(context.Context, Call) (Result, error) {
	return Result{Status: StatusSucceeded}, nil
}
func (succeed) DeduplicatesByKey() bool { return false }

func TestNotifyWakesDispatcherBeforePollInterval(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	l, err := New(Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	d, err := NewDispatcher(DispatcherConfig{
		Pool: pool, Tables: tables, PollInterval: time.Hour,
		Executors: map[string]Executor{"mail": succeed{}},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})

	// Wait until the dispatcher listens and has made its claim after LISTEN,
	// so that only a notification can bring the next effect to it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = $1", l.sql.listen).Scan(&n))
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "dispatcher never listened")
		time.Sleep(10 * time.Millisecond)
	}
	first := record(t, l, pool, "first")
	waitStatus(t, l, first, StatusSucceeded, deadline)

	second := record(t, l, pool, "second")
	// Poll interval is an hour: meeting this deadline takes the notification.
	waitStatus(t, l, second, StatusSucceeded, time.Now().Add(10*time.Second))
}

func record(t *testing.T, l *Ledger, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, key string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	e, err := l.Record(ctx, tx, Effect{Type: "mail", BusinessKey: key, Request: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return e.ID
}

func waitStatus(t *testing.T, l *Ledger, id string, s Status, deadline time.Time) {
	t.Helper()
	for {
		e, err := l.Get(context.Background(), id)
		require.NoError(t, err)
		if e.Status == s {
			return
		}
		require.True(t, time.Now().Before(deadline), "effect %s is %s, want %s before the deadline", id, e.Status, s)
		time.Sleep(10 * time.Millisecond)
	}
}
