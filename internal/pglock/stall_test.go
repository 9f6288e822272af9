package pglock

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// frozenEnv is one test's lock key, a pool straight to PostgreSQL, and a
// pool whose connections go through a proxy the test can stall: StallOpen
// freezes the connections open at that moment (their bytes stop flowing
// both ways while their sockets stay open, as on a network that drops
// packets without resetting anything); connections opened after it pass.
type frozenEnv struct {
	key     string
	direct  *pgxpool.Pool
	proxied *pgxpool.Pool
	proxy   *faultproxy.Proxy
}

func newFrozenEnv(t *testing.T) frozenEnv {
	t.Helper()
	direct := testdb.Pool(t) // skips or fails when PostgreSQL is unreachable
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.New(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	cfg.ConnConfig.Host = host
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Port = uint16(p)
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	// Cleanups run last-in first-out: cut the proxy's connections first, so
	// that the pool does not wait on frozen connections as it closes.
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Sever)
	return frozenEnv{key: testdb.Name(t, "lock"), direct: direct, proxied: pool, proxy: proxy}
}

// logWatch is a slog.Handler that remembers the messages it saw and closes
// waiting on the first "held elsewhere" one.
type logWatch struct {
	mu      sync.Mutex
	seen    map[string]bool
	waiting chan struct{}
}

func newLogWatch() *logWatch {
	return &logWatch{seen: map[string]bool{}, waiting: make(chan struct{})}
}

func (w *logWatch) saw(msg string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[msg]
}

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.Message == "pglock: held elsewhere, waiting as standby" && !w.seen[r.Message] {
		close(w.waiting)
	}
	w.seen[r.Message] = true
	return nil
}
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *logWatch) WithGroup(string) slog.Handler      { return w }

func TestStandbyOnFrozenConnectionTakesOverAfterRelease(t *testing.T) {
	t.Parallel()
	e := newFrozenEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	holder, err := Acquire(ctx, e.direct, e.key, fast)
	require.NoError(t, err)

	logs := newLogWatch()
	cfg := fast
	cfg.HealthTimeout = 300 * time.Millisecond
	cfg.Logger = slog.New(logs)
	type result struct {
		l   *Lock
		err error
	}
	standby := make(chan result, 1)
	go func() {
		l, err := Acquire(ctx, e.proxied, e.key, cfg)
		standby <- result{l, err}
	}()
	select {
	case <-logs.waiting:
	case <-ctx.Done():
		t.Fatal("standby never started waiting")
	}

	// The standby's connection freezes mid-wait; new connections still work.
	e.proxy.StallOpen()
	require.NoError(t, holder.Release(ctx))

	select {
	case r := <-standby:
		require.NoError(t, r.err)
		require.NoError(t, r.l.Release(ctx)) // first: the pool closes only once the lock's connection is back
		require.True(t, logs.saw("pglock: try lock failed, reconnecting"), "the standby's frozen connection was replaced")
	case <-time.After(5 * time.Second):
		t.Fatal("standby on a frozen connection did not take the lock within 5s of its release")
	}
}

func TestReleaseOnFrozenConnectionReturns(t *testing.T) {
	t.Parallel()
	e := newFrozenEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// No health check during the test: Release must meet the frozen
	// connection itself, not a lock already marked lost.
	cfg := Config{HealthInterval: time.Hour, HealthTimeout: 300 * time.Millisecond}
	l, err := Acquire(ctx, e.proxied, e.key, cfg)
	require.NoError(t, err)
	e.proxy.StallOpen()

	released := make(chan error, 1)
	go func() { released <- l.Release(context.WithoutCancel(ctx)) }()
	select {
	case err := <-released:
		require.Error(t, err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), e.key)
	case <-time.After(5 * time.Second):
		t.Fatal("Release on a frozen connection did not return within 5s")
	}

	// Once the backend sees its socket close, the server drops the lock; and
	// pgx, no longer draining a frozen socket, lets the pool destroy the
	// connection Release gave back.
	e.proxy.Sever()
	require.Eventually(t, func() bool { return e.proxied.Stat().AcquiredConns() == 0 },
		5*time.Second, 10*time.Millisecond, "Release must give its connection back")
	other, err := Acquire(ctx, e.direct, e.key, fast)
	require.NoError(t, err)
	require.NoError(t, other.Release(ctx))
}
