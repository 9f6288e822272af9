package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

// fast makes waits and health checks quick enough for tests.
var fast = Config{PollInterval: 20 * time.Millisecond, HealthInterval: 20 * time.Millisecond}

func TestSecondAcquirerWaitsUntilFirstReleases(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	key := testdb.Name(t, "lock")
	ctx := context.Background()

	first, err := Acquire(ctx, pool, key, fast)
	require.NoError(t, err)

	// While the first holds the lock, a second Acquire cannot complete.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = Acquire(short, pool, key, fast)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	type result struct {
		l   *Lock
		err error
	}
	second := make(chan result, 1)
	go func() {
		l, err := Acquire(ctx, pool, key, fast)
		second <- result{l, err}
	}()
	require.NoError(t, first.Release(ctx))

	select {
	case r := <-second:
		require.NoError(t, r.err)
		require.NoError(t, r.l.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("second acquirer did not get the lock after the first released it")
	}
}

func TestKilledHolderLosesLockAndStandbyTakesOver(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	key := testdb.Name(t, "lock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	active, err := Acquire(ctx, pool, key, fast)
	require.NoError(t, err)
	pid := active.conn.Conn().PgConn().PID()

	standby := make(chan *Lock, 1)
	standbyErr := make(chan error, 1)
	go func() {
		l, err := Acquire(ctx, pool, key, fast)
		if err != nil {
			standbyErr <- err
			return
		}
		standby <- l
	}()

	var terminated bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated))
	require.True(t, terminated)

	select {
	case <-active.Lost():
	case <-ctx.Done():
		t.Fatal("Lost did not close after the holder's backend was terminated")
	}
	select {
	case l := <-standby:
		require.NoError(t, l.Release(ctx))
	case err := <-standbyErr:
		t.Fatalf("standby: %v", err)
	case <-ctx.Done():
		t.Fatal("standby did not take over")
	}
	require.NoError(t, active.Release(ctx), "releasing a lost lock")
}

func TestDifferentKeysDoNotBlockEachOther(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a, err := Acquire(ctx, pool, testdb.Name(t, "a"), fast)
	require.NoError(t, err)
	b, err := Acquire(ctx, pool, testdb.Name(t, "b"), fast)
	require.NoError(t, err)
	require.NoError(t, a.Release(ctx))
	require.NoError(t, b.Release(ctx))
}

func TestReleaseTwiceIsAnError(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	l, err := Acquire(ctx, pool, testdb.Name(t, "lock"), fast)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Release(ctx), ErrReleased)
	select {
	case <-l.done:
	default:
		t.Fatal("health check still running after Release")
	}
}

func TestAcquireGivesBackItsConnectionWhenCancelled(t *testing.T) {
	t.Parallel()
	shared := testdb.Pool(t) // skips or fails when PostgreSQL is unreachable
	key := testdb.Name(t, "lock")
	ctx := context.Background()
	held, err := Acquire(ctx, shared, key, fast)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(ctx)) }()

	// A pool of its own, so that other tests do not change its counts.
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = Acquire(short, pool, key, fast)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// A connection whose query the deadline cut is destroyed, not put back,
	// and the pool counts it until it has closed.
	require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond,
		"Acquire kept a connection")
}

// The id must never change between versions: during a rolling deploy an old
// and a new process must contend for the same lock.
func TestKeyIsStableAcrossVersions(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(-635469962069592284), Key("orders/stream-a"))
	require.NotEqual(t, Key("orders/stream-a"), Key("orders/stream-b"))
}

func TestTryAcquireFailsAtOnceWhileHeld(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	key := testdb.Name(t, "try")
	first, err := TryAcquire(ctx, pool, key, Config{})
	require.NoError(t, err)
	_, err = TryAcquire(ctx, pool, key, Config{})
	require.ErrorIs(t, err, ErrHeld)
	require.NoError(t, first.Release(ctx))
	second, err := TryAcquire(ctx, pool, key, Config{})
	require.NoError(t, err)
	require.NoError(t, second.Release(ctx))
}
