package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// When the dead-letter queue refuses every dead letter (it is full, with
// x-overflow reject-publish), each session ends as soon as it meets a
// poison message: the message stays unacked, since its dead letter was not
// stored. Reconnecting must back off across such sessions instead of
// starting one every 100 ms, the refusal must be logged as a refusal (not
// as an unroutable queue), and nothing may be counted as dead-lettered.
func TestRefusedDeadLettersBackOffAcrossSessionsAndAreNotCounted(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	q := testbroker.Queue(t)
	ch := testbroker.Channel(t)
	require.NoError(t, ch.Confirm(false))
	declare := func(name string, args amqp.Table) {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		require.NoError(t, err)
	}
	declare(q+".dlq", amqp.Table{"x-queue-type": "classic", "x-max-length": int64(0), "x-overflow": "reject-publish"})
	declare(q+".retry", amqp.Table{"x-queue-type": "classic", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
	declare(q, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q + ".dlq",
		"x-delivery-limit": int64(100)})
	ctx := context.Background()
	const poison = 3
	for i := range poison {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false,
			amqp.Publishing{MessageId: "poison-" + string(rune('a'+i)), Body: []byte("x")})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		acked, err := dc.WaitContext(wctx)
		cancel()
		require.NoError(t, err)
		require.True(t, acked)
	}

	var logs testrun.LogBuffer
	c, err := consumer.New(consumer.Config{
		AMQPURL: testbroker.URL(), Name: "refused", Pool: pool, Queue: q, Tables: tables,
		Topology: consumer.Existing, Workers: 2, ReconnectMaxDelay: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	c.Handle(func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("poison"))
	})
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	require.NoError(t, c.Run(rctx))

	s := c.Stats()
	// Backoff from 100 ms doubling (with equal jitter, at least 50, 100,
	// 200, 400, 800, 1600 ms) leaves room for at most 5 reconnects in 3 s;
	// without it there are about 12.
	require.LessOrEqual(t, s.Reconnects, int64(6), "reconnects in 3 s while the dead-letter queue refuses")
	require.GreaterOrEqual(t, s.Reconnects, int64(1), "the refusal must end the session")
	require.Zero(t, s.DeadLettered, "no dead letter was stored")
	require.Zero(t, s.Retried)
	require.Contains(t, logs.String(), "refused")
	require.NotContains(t, logs.String(), "unroutable", "a nack is not a basic.return")

	info, err := ch.QueueDeclarePassive(q+".dlq", true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, info.Messages, "the dead-letter queue refused everything")
	// Nothing lost: every poison message is back in the queue.
	require.Eventually(t, func() bool {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && info.Messages == poison
	}, 10*time.Second, 50*time.Millisecond)
}
