package ledger

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// runDispatcher runs d until the test ends, and fails the test if Run does
// not return within 15 seconds of being cancelled.
func runDispatcher(t *testing.T, d *Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of being cancelled")
		}
	})
}

// requireHealthy waits until d reports itself ready and live.
func requireHealthy(t *testing.T, d *Dispatcher, within time.Duration) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := d.Health()
		assert.True(c, s.Ready && s.Live, "%+v", s)
	}, within, 10*time.Millisecond)
}

// A database that stops answering without resetting its connections (a
// failover, a dead peer) must not hang the sweep, nor leave the dispatcher
// reporting itself ready on a frozen listening connection.
func TestStalledDatabaseBoundsTheSweepAndMakesTheDispatcherNotReady(t *testing.T) {
	t.Parallel()
	direct, tables := testdb.Schema(t)
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.New(t, u.Host)
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Resume) // before the pool closes its connections
	l, err := New(Config{Pool: direct, Tables: tables})
	require.NoError(t, err)

	d, err := NewDispatcher(DispatcherConfig{Pool: pool, Tables: tables, PollInterval: 50 * time.Millisecond,
		Executors: map[string]Executor{"mail": succeed{}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	d.dbTimeout = 500 * time.Millisecond
	runDispatcher(t, d)
	requireHealthy(t, d, 10*time.Second)

	proxy.Stall()
	// Every connection, the listening one too, stays open and goes silent.
	const bound = 5 * time.Second
	swept := make(chan error, 1)
	begin := time.Now()
	go func() { swept <- d.sweep(context.Background()) }()
	select {
	case err := <-swept:
		require.ErrorContains(t, err, "ledger: sweep")
		t.Logf("sweep on a stalled database returned after %s: %v", time.Since(begin).Round(time.Millisecond), err)
	case <-time.After(bound):
		t.Fatalf("sweep still waiting on a stalled database after %s", bound)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := d.Health()
		assert.False(c, s.Ready, "while the database is stalled the dispatcher is not ready")
		assert.Contains(c, s.Reason, "database: ledger: sweep")
		assert.Contains(c, s.Reason, "not listening for notifications")
	}, bound, 10*time.Millisecond)
	// Its loops still turn: it waits for its database, it is not wedged.
	require.True(t, d.Health().Live, "%+v", d.Health())

	proxy.Resume()
	requireHealthy(t, d, 15*time.Second)
	id := record(t, l, direct, "after-the-stall")
	waitStatus(t, l, id, StatusSucceeded, time.Now().Add(15*time.Second))
}

// blockingHandler is a slog handler whose Handle blocks on records whose
// message contains match, until release is closed.
type blockingHandler struct {
	match   string
	once    sync.Once
	blocked chan struct{} // closed when a record first blocks
	release chan struct{}
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler            { return h }
func (h *blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.once.Do(func() { close(h.blocked) })
		<-h.release
	}
	return nil
}

// A sweep loop that stops turning, for whatever reason, makes the dispatcher
// not live even while its claim loop turns.
func TestStuckSweepLoopMakesTheDispatcherNotLive(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	l, err := New(Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	// An effect whose lease expired in flight: the sweep settles it and
	// logs it, and that log call never returns until released.
	id := record(t, l, pool, "expired")
	_, err = pool.Exec(context.Background(), "UPDATE "+tables.WithDefaults().Table("ledger")+
		" SET status = 'in_flight', lock_owner = 'gone', locked_until = now() - interval '1 second' WHERE effect_id = $1", id)
	require.NoError(t, err)
	h := &blockingHandler{match: "lease expired", blocked: make(chan struct{}), release: make(chan struct{})}
	d, err := NewDispatcher(DispatcherConfig{Pool: pool, Tables: tables, PollInterval: 20 * time.Millisecond,
		Executors: map[string]Executor{"mail": succeed{}}, Logger: slog.New(h)})
	require.NoError(t, err)
	d.dbTimeout = 200 * time.Millisecond
	runDispatcher(t, d)
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release) // before Run is cancelled: it waits for the sweep loop
		}
	})

	select {
	case <-h.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep never settled the expired lease")
	}
	// The claim loop keeps turning; the sweep loop does not.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := d.Health()
		assert.False(c, s.Live, "a sweep loop that stopped turning is wedged")
		assert.False(c, s.Ready)
		assert.Contains(c, s.Reason, "its sweep loop has not turned")
	}, 10*time.Second, 10*time.Millisecond)
	require.NotContains(t, d.Health().Reason, "its claim loop")

	close(h.release)
	requireHealthy(t, d, 10*time.Second)
}

// A database that refuses or stops answering makes the dispatcher not
// ready within seconds, with its database calls still bounded by their
// full timeout: its own probe sees it first.
func TestDispatcherIsNotReadyWithinSecondsWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(*faultproxy.Proxy){
		"refused":    (*faultproxy.Proxy).Refuse,
		"blackholed": (*faultproxy.Proxy).Stall,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, tables := testdb.Schema(t)
			pool, proxy := testdb.Proxied(t)
			d, err := NewDispatcher(DispatcherConfig{Pool: pool, Tables: tables,
				Executors: map[string]Executor{"mail": succeed{}}, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			runDispatcher(t, d)
			requireHealthy(t, d, 10*time.Second)
			fail(proxy)
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				s := d.Health()
				assert.False(c, s.Ready, "%+v", s)
				assert.Contains(c, s.Reason, "database")
			}, 10*time.Second, 20*time.Millisecond)
			proxy.Resume()
			requireHealthy(t, d, 30*time.Second)
		})
	}
}
