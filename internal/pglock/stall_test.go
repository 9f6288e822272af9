package pglock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testdb"
)

// stallProxy forwards TCP between a pool and PostgreSQL. Stall freezes the
// connections open at that moment: their bytes stop flowing both ways while
// their sockets stay open, as on a network that drops packets without
// resetting anything. Connections opened after Stall pass.
type stallProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   []net.Conn
	pairs   int // pairs accepted so far
	stalled int // pairs with an index below this are frozen
	closed  bool
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, upstream: upstream}
	p.wg.Go(p.serve)
	return p
}

func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// Stall freezes every connection accepted so far.
func (p *stallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = p.pairs
}

func (p *stallProxy) frozen(pair int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pair < p.stalled
}

// Close closes the listener and every socket, frozen or not, and waits for
// the forwarders to end.
func (p *stallProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

func (p *stallProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		pair := p.pairs
		p.pairs++
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Go(func() { p.forward(pair, server, client) })
		p.wg.Go(func() { p.forward(pair, client, server) })
	}
}

// forward copies src to dst until either closes or the pair is frozen; a
// frozen pair's sockets stay open, unread and unwritten, until Close.
func (p *stallProxy) forward(pair int, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.frozen(pair) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			// Pass the half-close on, as a network would.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// proxiedPool returns a pool whose connections go through a new stallProxy.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *stallProxy) {
	t.Helper()
	testdb.Pool(t) // skips or fails when PostgreSQL is unreachable
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	proxy := newStallProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	defer func() {
		if t.Failed() {
			proxy.Close()
		}
	}()
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	cfg.ConnConfig.Host = host
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Port = uint16(p)
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	// Cleanups run last-in first-out: close the proxy first, so that the
	// pool does not wait on frozen connections as it closes.
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Close)
	return pool, proxy
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
	direct := testdb.Pool(t)
	proxied, proxy := proxiedPool(t)
	key := testdb.Name(t, "lock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	holder, err := Acquire(ctx, direct, key, fast)
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
		l, err := Acquire(ctx, proxied, key, cfg)
		standby <- result{l, err}
	}()
	select {
	case <-logs.waiting:
	case <-ctx.Done():
		t.Fatal("standby never started waiting")
	}

	// The standby's connection freezes mid-wait; new connections still work.
	proxy.Stall()
	require.NoError(t, holder.Release(ctx))

	select {
	case r := <-standby:
		require.NoError(t, r.err)
		require.True(t, logs.saw("pglock: try lock failed, reconnecting"), "the standby's frozen connection was replaced")
		require.NoError(t, r.l.Release(ctx))
	case <-time.After(5 * time.Second):
		t.Fatal("standby on a frozen connection did not take the lock within 5s of its release")
	}
}

func TestReleaseOnFrozenConnectionReturns(t *testing.T) {
	t.Parallel()
	direct := testdb.Pool(t)
	proxied, proxy := proxiedPool(t)
	key := testdb.Name(t, "lock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// No health check during the test: Release must meet the frozen
	// connection itself, not a lock already marked lost.
	cfg := Config{HealthInterval: time.Hour, HealthTimeout: 300 * time.Millisecond}
	l, err := Acquire(ctx, proxied, key, cfg)
	require.NoError(t, err)
	proxy.Stall()

	released := make(chan error, 1)
	go func() { released <- l.Release(context.WithoutCancel(ctx)) }()
	select {
	case err := <-released:
		require.Error(t, err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), key)
	case <-time.After(5 * time.Second):
		t.Fatal("Release on a frozen connection did not return within 5s")
	}

	// Once the backend sees its socket close, the server drops the lock; and
	// pgx, no longer draining a frozen socket, lets the pool destroy the
	// connection Release gave back.
	proxy.Close()
	require.Eventually(t, func() bool { return proxied.Stat().AcquiredConns() == 0 },
		5*time.Second, 10*time.Millisecond, "Release must give its connection back")
	other, err := Acquire(ctx, direct, key, fast)
	require.NoError(t, err)
	require.NoError(t, other.Release(ctx))
}
