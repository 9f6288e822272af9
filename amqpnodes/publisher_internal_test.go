package amqpnodes

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testbroker"
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
