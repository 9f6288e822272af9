package consumer

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// A key's deliveries stay in order through the hold whatever the batches
// take: the failed one first, then what was released but not taken yet,
// then what arrived meanwhile; other keys pass.
func TestKeyHoldKeepsEachKeysDeliveriesInOrder(t *testing.T) {
	eng, err := engine.New(engine.Config{Name: "test", Pool: testdb.Pool(t)}) // Count needs its instruments
	require.NoError(t, err)
	src := &queueSource{cfg: Config{Name: "test", Logger: testLogger(), RetryBaseDelay: time.Hour, RetryMaxDelay: time.Hour,
		MaxAttempts: 5}, orderingKey: func(m *Message) string { return m.ID[:1] }, eng: eng}
	s := &session{acks: newAcker(noAcks{}, 100), gate: amqpconn.NewGate(1 << 20), dead: make(chan struct{})}
	h := src.newKeyHold(s)
	tag := uint64(0)
	d := func(id string) *delivery {
		tag++
		s.acks.deliver(tag)
		return &delivery{d: amqp.Delivery{DeliveryTag: tag}, it: &engine.Item{Message: &idem.Message{ID: id, Attempt: 1}, Key: id[:1]}}
	}
	ids := func(ds []*delivery) []string {
		out := []string{}
		for _, x := range ds {
			out = append(out, x.it.ID)
		}
		return out
	}
	ctx := context.Background()
	a1, b1 := d("a1"), d("b1")
	settle, _ := h.keep(ctx, []*delivery{a1, b1}, []engine.Result{{Outcome: idem.Retried}, {Outcome: idem.Processed}})
	require.Equal(t, []string{"b1"}, ids(settle))
	require.True(t, a1.it.Returned, "a1's next attempt reads its failures")
	h.sweep()
	a2, a3, c1 := d("a2"), d("a3"), d("c1")
	require.True(t, h.add(a2), "a2 waits behind a1")
	require.True(t, h.add(a3), "a3 waits behind a2")
	require.False(t, h.add(c1), "c1's key is not held")
	require.Empty(t, h.take(nil, 10), "a1's backoff has not ended")
	require.NotNil(t, h.wake())

	h.keys["a"].due = time.Now() // the backoff ends
	batch := h.take(nil, 2)
	require.Equal(t, []string{"a1", "a2"}, ids(batch), "as many as the batch takes, a3 released behind them")
	require.Nil(t, h.wake(), "no key held")
	// a1 fails again (a2 was Held behind it): a3, released but not taken,
	// waits behind them again, and so does a4, which arrives later; c2, in
	// the rest of the batch, runs.
	h.keep(ctx, batch, []engine.Result{{Outcome: idem.Retried}, {Outcome: idem.Held}})
	require.Equal(t, []string{"c2"}, ids(h.divert([]*delivery{d("c2")})))
	h.sweep()
	require.True(t, h.add(d("a4")))
	require.Equal(t, []string{"a1", "a2", "a3", "a4"}, ids(h.keys["a"].queue))
	require.Empty(t, h.take(nil, 10))
	require.Empty(t, h.released)
}
