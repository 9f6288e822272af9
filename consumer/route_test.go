package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

type noAcks struct{}

func (noAcks) Ack(uint64, bool) error        { return nil }
func (noAcks) Nack(uint64, bool, bool) error { return nil }

// Messages with one affinity key go to one worker's input; a redelivered
// message goes to the isolation goroutine whatever its key.
func TestRouterSendsOneKeyToOneWorkerAndSuspectsToIsolation(t *testing.T) {
	key := func(m *idem.Message) string { return string(m.Body) }
	eng, err := engine.New(engine.Config{Name: "test", Pool: testdb.Pool(t)}) // routing counts redeliveries
	require.NoError(t, err)
	src := &queueSource{cfg: Config{Workers: 4, RetryQueue: "q.retry"}, affinityKey: key, eng: eng}
	s := &session{acks: newAcker(noAcks{}, 100), gate: amqpconn.NewGate(1 << 20), dead: make(chan struct{})}
	r := &router{src: src, s: s, key: key, suspects: make(chan *delivery, 100)}
	for range 4 {
		r.inputs = append(r.inputs, make(chan *delivery, 100))
	}
	ctx := context.Background()
	tag := uint64(0)
	route := func(d amqp.Delivery) bool {
		var m idem.Message
		src.message(&d, time.Now(), &m)
		return r.route(ctx, &delivery{d: d, s: s, it: &engine.Item{Message: &m}})
	}
	for range 3 {
		for k := range 8 {
			tag++
			require.True(t, route(amqp.Delivery{DeliveryTag: tag, Body: []byte(fmt.Sprintf("key-%d", k))}))
		}
	}
	tag++
	require.True(t, route(amqp.Delivery{DeliveryTag: tag, Body: []byte("key-0"), Redelivered: true}))
	require.Len(t, r.suspects, 1)
	seen := map[string]int{} // key → input
	total := 0
	for i, in := range r.inputs {
		for len(in) > 0 {
			d := <-in
			total++
			k := string(d.it.Body)
			if w, ok := seen[k]; ok {
				require.Equal(t, w, i, "key %s went to two workers", k)
			}
			seen[k] = i
		}
	}
	require.Equal(t, 24, total)
	require.Len(t, seen, 8)
}
