package retention_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/replay"
	"github.com/idemkit/idem/retention"
)

// charges is a charge executor that counts its calls per order.
type charges struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *charges) Execute(_ context.Context, call ledger.Call) (ledger.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[call.BusinessKey]++
	return ledger.Result{Status: ledger.StatusSucceeded}, nil
}

func (*charges) DeduplicatesByKey() bool { return false }

func (c *charges) counted() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, n := range c.calls {
		out[k] = n
	}
	return out
}

// A stream consumer charges three orders; retention (its floor lowered)
// deletes their inbox rows and their settled effects; a repair of one
// message then records its charge again, without Redispatch: the effect is
// suppressed by its tombstone, and each order is charged once in all.
func TestRepairAfterRetentionChargesNothingAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	se, err := streamio.Open(ctx, streamio.Config{URI: streamio.URLFromEnv()})
	if err != nil {
		testdb.Unavailable(t, "RabbitMQ stream port", err)
	}
	t.Cleanup(func() { _ = se.Close() })
	name := testdb.Name(t, "s")
	require.NoError(t, se.DeclareStream(ctx, name, streamio.StreamOptions{}))
	t.Cleanup(func() { _ = se.DeleteStream(context.Background(), name) })
	var out []streamio.Outgoing
	for i := range 3 {
		out = append(out, streamio.Outgoing{MessageID: fmt.Sprintf("m-%d", i), Body: fmt.Appendf(nil, `{"order":"o-%d"}`, i)})
	}
	require.NoError(t, se.Publish(ctx, name, out))

	l, err := ledger.New(ledger.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: f.pool, Tables: f.tables,
		Stream: name, StreamURL: streamio.URLFromEnv(), Topology: consumer.Passive, // declared above
		Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 10 * time.Second})
	require.NoError(t, err)
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v struct{ Order string }) error {
		_, err := l.Record(ctx, tx, ledger.Effect{Type: "charge", BusinessKey: v.Order, Request: v,
			Consumer: "billing", MessageID: m.ID})
		return err
	}))
	ex := &charges{calls: map[string]int{}}
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: f.pool, Tables: f.tables, PollInterval: 20 * time.Millisecond,
		Executors: map[string]ledger.Executor{"charge": ex}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	dctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(dctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-stopped)
	})

	live(t, f, c, name, 2)
	for i := range 3 {
		settled(t, l, fmt.Sprintf("o-%d", i))
	}
	time.Sleep(20 * time.Millisecond) // past the cleanup's one-millisecond cutoff
	res, err := retention.Clean(ctx, retention.Config{Pool: f.pool, Tables: f.tables,
		OlderThan: time.Millisecond, LedgerOlderThan: time.Millisecond, Floor: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted("inbox"))
	require.Equal(t, int64(3), res.Deleted("ledger"))

	s, err := replay.Run(ctx, c, replay.Options{Mode: idem.Repair, Select: replay.Selection{IDs: []string{"m-1"}},
		Operator: "alice", Reason: "INC-7 totals"})
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Processed)

	again := settled(t, l, "o-1")
	require.Equal(t, ledger.StatusSuppressed, again.Status, again.LastError)
	require.Contains(t, again.LastError, "settled before as succeeded")
	time.Sleep(100 * time.Millisecond) // five polls of the dispatcher
	require.Equal(t, map[string]int{"o-0": 1, "o-1": 1, "o-2": 1}, ex.counted(), "each order charged once")
}

// live runs c as the live consumer until its checkpoint reaches last.
func live(t *testing.T, f *fixture, c *consumer.Consumer, name string, last int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		at, ok, err := store.Checkpoint(context.Background(), f.pool, f.tables, "billing", name)
		require.NoError(t, err)
		if ok && at == last {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the live consumer did not reach offset %d", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the live consumer did not stop")
	}
}

// settled waits until the charge of order is settled (succeeded or
// suppressed) and returns it.
func settled(t *testing.T, l *ledger.Ledger, order string) ledger.Entry {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		e, err := l.Get(context.Background(), ledger.EffectID("charge", order))
		require.NoError(t, err)
		if e.Status == ledger.StatusSucceeded || e.Status == ledger.StatusSuppressed {
			return e
		}
		require.True(t, time.Now().Before(deadline), "the charge of %s did not settle: %+v", order, e)
		time.Sleep(10 * time.Millisecond)
	}
}
