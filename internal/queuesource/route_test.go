package queuesource

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/engine"
)

type noAcks struct{}

func (noAcks) Ack(uint64, bool) error        { return nil }
func (noAcks) Nack(uint64, bool, bool) error { return nil }

// Messages with one affinity key go to one worker's input; a redelivered
// message goes to the isolation goroutine whatever its key.
func TestRouterSendsOneKeyToOneWorkerAndSuspectsToIsolation(t *testing.T) {
	key := func(it *engine.Item) string { return it.BusinessKey }
	tel, err := engine.NewTelemetry("test", "q", nil, nil, func() (int64, bool) { return 0, false })
	require.NoError(t, err)
	eng, err := engine.New(engine.Config{Name: "test", Telemetry: tel}) // routing counts redeliveries
	require.NoError(t, err)
	src := New(Config{Workers: 4, RetryQueue: "q.retry", AffinityKey: key,
		Prepare: func(d *amqp.Delivery, _ time.Time) *engine.Item { return &engine.Item{BusinessKey: string(d.Body)} }}, eng)
	s := &session{acks: newAcker(noAcks{}, 100), gate: newGate(1 << 20), dead: make(chan struct{})}
	r := &router{src: src, s: s, key: key, suspects: make(chan *delivery, 100)}
	for range 4 {
		r.inputs = append(r.inputs, make(chan *delivery, 100))
	}
	ctx := context.Background()
	tag := uint64(0)
	for range 3 {
		for k := range 8 {
			tag++
			require.True(t, r.route(ctx, amqp.Delivery{DeliveryTag: tag, Body: []byte(fmt.Sprintf("key-%d", k))}))
		}
	}
	tag++
	require.True(t, r.route(ctx, amqp.Delivery{DeliveryTag: tag, Body: []byte("key-0"), Redelivered: true}))
	require.Len(t, r.suspects, 1)
	seen := map[string]int{} // key → input
	total := 0
	for i, in := range r.inputs {
		for len(in) > 0 {
			d := <-in
			total++
			k := d.it.BusinessKey
			if w, ok := seen[k]; ok {
				require.Equal(t, w, i, "key %s went to two workers", k)
			}
			seen[k] = i
		}
	}
	require.Equal(t, 24, total)
	require.Len(t, seen, 8)
}
