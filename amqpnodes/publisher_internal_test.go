package amqpnodes

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// newTestPublisher returns a Publisher on the test broker, closed when the
// test ends.
func newTestPublisher(t *testing.T) *Publisher {
	t.Helper()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	p, err := NewPublisher(context.Background(), []string{testbroker.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// A nacked message is published again through a new connection, and Flush
// returns once the broker stored it.
func TestPublisherRepublishesANackedMessageThroughANewConnection(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.FullQueue(t, ch) // the broker nacks m2 until the test makes room
	p := newTestPublisher(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, "", q, amqp.Publishing{MessageId: "m1", Body: []byte(`1`)}))
	require.NoError(t, p.Flush(ctx))

	nacked, room := make(chan int, 1), make(chan struct{})
	p.pause = func(_ context.Context, attempt int) error {
		nacked <- attempt
		<-room
		return nil
	}
	first := p.ch
	require.NoError(t, p.Publish(ctx, "", q, amqp.Publishing{MessageId: "m2", Body: []byte(`2`)}))
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(ctx) }()
	require.Equal(t, 0, <-nacked, "the first round was nacked")
	_, err := ch.QueuePurge(q, false)
	require.NoError(t, err)
	close(room)
	require.NoError(t, <-flushed)
	require.NotSame(t, first, p.ch, "republished through a new channel")
	require.True(t, first.IsClosed(), "the nacked channel is closed")
	d, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "m2", d.MessageId)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
}

// A message no queue takes is reported, not waited for.
func TestPublisherReportsAnUnroutableMessage(t *testing.T) {
	t.Parallel()
	p := newTestPublisher(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, "", testbroker.Queue(t)+".nobody", amqp.Publishing{MessageId: "lost", Body: []byte(`1`)}))
	err := p.Flush(ctx)
	require.ErrorIs(t, err, ErrNotStored)
	require.ErrorContains(t, err, "lost")
}

// twoNodes returns a publisher given two "nodes", two proxies in front of
// the test broker, and the proxy it is connected through (the other one
// second).
func twoNodes(t *testing.T) (*Publisher, *testbroker.Proxy, *testbroker.Proxy) {
	t.Helper()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	a, b := testbroker.NewProxy(t), testbroker.NewProxy(t)
	p, err := NewPublisher(context.Background(), []string{a.URL(), b.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	if p.node == b.URL() {
		a, b = b, a
	}
	require.Equal(t, a.URL(), p.node)
	return p, a, b
}

// storedIDs takes every message off q and returns their ids, each once.
func storedIDs(t *testing.T, ch *amqp.Channel, q string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for {
		d, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if !ok {
			return ids
		}
		ids[d.MessageId] = true
	}
}

// twoNodesAndAQueue is twoNodes with a channel of the test broker and a
// new queue on it, for the publisher to fill.
func twoNodesAndAQueue(t *testing.T) (*Publisher, *testbroker.Proxy, *amqp.Channel, string) {
	t.Helper()
	p, node, _ := twoNodes(t)
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	return p, node, ch, q
}

// publishAll publishes ids first..last-1 to q, calling between after the
// message at index mid was published, then flushes.
func publishAll(ctx context.Context, t *testing.T, p *Publisher, q string, n, mid int, between func()) {
	t.Helper()
	for i := range n {
		if i == mid {
			between()
		}
		require.NoError(t, p.Publish(ctx, "", q, amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), Body: []byte(`1`)}))
	}
	require.NoError(t, p.Flush(ctx))
}

// A publisher whose node goes down (its connections cut, new ones refused)
// moves to another node and sends again what was not confirmed, under the
// same ids: every message is stored, none reported unroutable.
func TestPublisherOutlivesItsNode(t *testing.T) {
	t.Parallel()
	p, node, ch, q := twoNodesAndAQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 1200 // across two automatic flushes
	publishAll(ctx, t, p, q, n, 700, node.Refuse)
	ids := storedIDs(t, ch, q)
	require.Len(t, ids, n, "every id stored")
}

// A node that stops answering (its TCP connections open, nothing passing:
// a frozen process, a blackholed host) is left once the heartbeat notices,
// and what it never confirmed goes out again through another node.
func TestPublisherLeavesANodeThatStopsAnswering(t *testing.T) {
	t.Parallel()
	p, node, ch, q := twoNodesAndAQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 300
	publishAll(ctx, t, p, q, n, 150, node.Stall)
	require.Len(t, storedIDs(t, ch, q), n, "every id stored")
}

// The client closes the returns channel with its AMQP channel; a closed
// returns channel is no unroutable message.
func TestPublisherReadsNoReturnFromAClosedChannel(t *testing.T) {
	t.Parallel()
	p, node, ch, q := twoNodesAndAQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, "", q, amqp.Publishing{MessageId: "m0", Body: []byte(`1`)}))
	node.Refuse()
	<-p.closed
	require.NoError(t, p.Flush(ctx), "sent again, not reported unroutable")
	require.Equal(t, map[string]bool{"m0": true}, storedIDs(t, ch, q))
}

// A message published without a MessageId goes out without one: an id the
// publisher invented would be another on each publish of the same message,
// and two publishes of one intent would be two messages.
func TestPublisherSendsAMessageWithoutAnIDAsItIs(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	p := newTestPublisher(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, "", q, amqp.Publishing{Body: []byte(`1`)}))
	require.NoError(t, p.Flush(ctx))
	d, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, d.MessageId)
}
