package retention

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestScheduledRoundsCleanOneProcessAtATime(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "INSERT INTO "+tables.Table("inbox")+` (consumer, message_id, payload_hash, received_at)
		VALUES ('c', 'm', decode(repeat('ab', 32), 'hex'), now() - interval '40 days')`)
	require.NoError(t, err)
	cfg := Config{Pool: pool, Tables: tables, OlderThan: 30 * 24 * time.Hour, Logger: slog.New(slog.DiscardHandler)}.withDefaults()

	// Another process is cleaning: this one skips its round.
	other, err := pglock.Acquire(ctx, pool, lockKey(cfg.Tables), pglock.Config{Logger: discard})
	require.NoError(t, err)
	res, ran, err := round(ctx, cfg)
	require.NoError(t, err)
	require.False(t, ran)
	require.Zero(t, res.Total())
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("inbox")).Scan(&n))
	require.Equal(t, 1, n)

	// Once it is done, the next round runs.
	require.NoError(t, other.Release(ctx))
	res, ran, err = round(ctx, cfg)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, int64(1), res.Deleted("inbox"))

	// The round released the lock: another process can take it at once.
	again, err := pglock.TryAcquire(ctx, pool, lockKey(cfg.Tables), pglock.Config{Logger: discard})
	require.NoError(t, err)
	require.NoError(t, again.Release(ctx))
}

func TestRunCleansSoonAfterItStartsAndStopsWithItsContext(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	_, err := pool.Exec(t.Context(), "INSERT INTO "+tables.Table("dead_letters")+` (consumer, payload_hash, reason, dead_lettered_at)
		VALUES ('c', decode(repeat('ab', 32), 'hex'), 'max_attempts', now() - interval '40 days')`)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Pool: pool, Tables: tables, OlderThan: 30 * 24 * time.Hour,
			Interval: time.Hour, Jitter: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+tables.Table("dead_letters")).Scan(&n))
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the first round did not run")
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
