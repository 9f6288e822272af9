package consumer

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// A session's publish channel can close under a batch that is settling
// (the broker closed the connection). Publishing the batch's dead letters
// then fails at once; it must not spin on the returns channel, which the
// client closes with the AMQP channel and which then never blocks: a worker
// spinning there keeps its session, and the process, from ever stopping.
func TestPublishingOnAClosedChannelFailsInsteadOfSpinning(t *testing.T) {
	t.Parallel()
	conn := testbroker.Dial(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	p := &publisher{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 2*publishChunk))}
	require.NoError(t, ch.Close())

	done := make(chan error, 1)
	go func() {
		_, err := p.publishAll(context.Background(), []outgoing{{queue: testbroker.Queue(t),
			msg: amqp.Publishing{MessageId: "m", Headers: amqp.Table{}}}})
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err, "the channel is closed")
	case <-time.After(5 * time.Second):
		t.Fatal("publishAll did not return on a closed channel")
	}
}
