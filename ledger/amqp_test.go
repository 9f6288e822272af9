package ledger_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/ledger"
)

// outboxQueue declares a fresh queue and returns its name and a channel to
// read it with.
func outboxQueue(t *testing.T) (string, *amqp.Channel) {
	t.Helper()
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	return q, ch
}

func newOutbox(t *testing.T) *ledger.AMQPExecutor {
	t.Helper()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	ex, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: testbroker.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	return ex
}

// messageIDs reads every message in q, waiting until want have arrived.
func messageIDs(t *testing.T, ch *amqp.Channel, q string, want int) []string {
	t.Helper()
	var ids []string
	deadline := time.Now().Add(15 * time.Second)
	for len(ids) < want {
		d, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if !ok {
			require.True(t, time.Now().Before(deadline), "got %d of %d messages", len(ids), want)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ids = append(ids, d.MessageId)
	}
	return ids
}

func TestOutboxPublishesWithEffectIDAsMessageID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q, ch := outboxQueue(t)
	ex := newOutbox(t)
	e := f.record(t, context.Background(), ledger.Effect{
		Type: "order.confirmed", BusinessKey: "order-9", Target: "default exchange",
		Request: ledger.Publishing{RoutingKey: q, Body: []byte(`{"order":9}`)},
	})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"order.confirmed": ex}})
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))

	d, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok, "the confirmed message is in the queue")
	require.Equal(t, e.ID, d.MessageId)
	require.Equal(t, "order.confirmed", d.Type)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.JSONEq(t, `{"order":9}`, string(d.Body))
}

func TestOutboxUnroutableMessageIsRetryable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ex := newOutbox(t)
	e := f.record(t, context.Background(), ledger.Effect{
		Type: "order.confirmed", BusinessKey: "order-9",
		Request: ledger.Publishing{Exchange: "amq.direct", RoutingKey: testbroker.Queue(t) + ".unbound", Body: []byte(`{}`)},
	})[0]
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:    map[string]ledger.Executor{"order.confirmed": ex},
		RetryBackoff: time.Hour, RetryBackoffMax: time.Hour,
	})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedRetryable))
	require.Contains(t, got.LastError, "returned unroutable")
}

// lostOutcome publishes for real, then (first call only) hangs until
// released, as if the process died between the broker's confirm and the
// outcome write.
type lostOutcome struct {
	*ledger.AMQPExecutor
	calls   atomic.Int32
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func (l *lostOutcome) Execute(ctx context.Context, c ledger.Call) (ledger.Result, error) {
	res, err := l.AMQPExecutor.Execute(ctx, c)
	if l.calls.Add(1) == 1 {
		l.once.Do(func() { close(l.started) })
		<-l.release
	}
	return res, err
}

func TestOutboxRepublishesWithSameMessageIDAfterLostOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q, ch := outboxQueue(t)
	ex := &lostOutcome{AMQPExecutor: newOutbox(t), started: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { close(ex.release) })
	e := f.record(t, context.Background(), ledger.Effect{
		Type: "order.confirmed", BusinessKey: "order-9",
		Request: ledger.Publishing{RoutingKey: q, Body: []byte(`{"order":9}`)},
	})[0]
	cfg := ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"order.confirmed": ex}, Lease: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	first := f.start(t, ctx, cfg)
	<-ex.started // published and confirmed; the outcome is never written
	cancel()
	require.NoError(t, <-first)

	f.dispatch(t, cfg)
	got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	require.Equal(t, 2, got.AttemptCount)
	// Published twice, never lost, always with the same message id: the
	// consumer downstream processes it once.
	require.Equal(t, []string{e.ID, e.ID}, messageIDs(t, ch, q, 2))
}

func TestOutboxReconnectsAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q, ch := outboxQueue(t)
	proxy := testbroker.NewProxy(t)
	ex, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: proxy.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"evt": ex}})

	a := f.record(t, context.Background(), ledger.Effect{Type: "evt", BusinessKey: "a", Request: ledger.Publishing{RoutingKey: q, Body: []byte(`1`)}})[0]
	f.waitFor(t, a.ID, status(ledger.StatusSucceeded))
	proxy.Sever()
	b := f.record(t, context.Background(), ledger.Effect{Type: "evt", BusinessKey: "b", Request: ledger.Publishing{RoutingKey: q, Body: []byte(`2`)}})[0]
	f.waitFor(t, b.ID, status(ledger.StatusSucceeded))
	require.ElementsMatch(t, []string{a.ID, b.ID}, messageIDs(t, ch, q, 2))
}

// With TimeOrderedMessageIDs, an effect's message id is a UUIDv7 of the
// time it was recorded, the same on every attempt: effects recorded later
// get ids that sort later.
func TestOutboxTimeOrderedMessageIDsAreStableAndSortByRecording(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q, ch := outboxQueue(t)
	testbroker.Dial(t)
	ex, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: testbroker.URL(), TimeOrderedMessageIDs: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	var effects []ledger.Entry
	for i := range 3 {
		effects = append(effects, f.record(t, context.Background(), ledger.Effect{
			Type: "order.confirmed", BusinessKey: fmt.Sprintf("order-%d", i),
			Request: ledger.Publishing{RoutingKey: q, Body: []byte(`{}`)},
		})[0])
		time.Sleep(2 * time.Millisecond)
	}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"order.confirmed": ex}})
	var want []string
	for _, e := range effects {
		got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
		want = append(want, ledger.TimeOrderedMessageID(got.CreatedAt, e.ID))
	}
	ids := messageIDs(t, ch, q, 3)
	require.ElementsMatch(t, want, ids)
	require.True(t, slices.IsSorted(want), "recorded later, sorted later: %v", want)
	require.Equal(t, byte('7'), ids[0][14], "version 7")
	require.Equal(t, want[0], ledger.TimeOrderedMessageID(effects[0].CreatedAt, effects[0].ID), "the same on every call")
}
