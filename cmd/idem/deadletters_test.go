package main

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testbroker"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDeadLettersListShowsReasonAndFilters(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Permanent(errors.New("card expired"))
	})
	_, err = c.Process(context.Background(), []consumer.Message{
		{MessageID: "m-1", Body: []byte(`{}`)},
		{Body: []byte(`{}`)},
	})
	require.NoError(t, err)

	out, stderr, code := runInboxCmd(t, tables, "deadletters", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "m-1")
	require.Contains(t, out, "card expired")
	require.Contains(t, out, deadletters.ReasonMissingMessageID)

	out, stderr, code = runInboxCmd(t, tables, "deadletters", "list", "--reason", deadletters.ReasonPermanent)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "m-1")
	require.NotContains(t, out, deadletters.ReasonMissingMessageID)

	_, _, code = runInboxCmd(t, tables, "deadletters")
	require.Equal(t, 2, code)
}

func TestDeadLettersRedriveMovesMessagesBackAndPrintsTheCount(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	queue := testbroker.Queue(t)
	ch := testbroker.Channel(t)
	for _, q := range []string{queue, queue + ".dlq"} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	h := idem.HashBytes([]byte("m-2"))
	require.NoError(t, ch.PublishWithContext(context.Background(), "", queue+".dlq", false, false, amqp.Publishing{
		MessageId: "m-2", Body: []byte("m-2"), Headers: amqp.Table{"x-idem-reason": "max_attempts",
			"x-idem-consumer": "billing", "x-idem-payload-hash": h.String()}}))

	out, stderr, code := f.cmd("deadletters", "redrive", "--queue", queue, "--reason", "max_attempts",
		"--operator", "alice", "--amqp-url", testbroker.URL())
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "moved 1 of 1 messages looked at from "+queue+".dlq back to "+queue+" (1 dead-letter rows marked)")
	d, ok, err := ch.Get(queue, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "m-2", d.MessageId)

	out, stderr, code = f.cmd("deadletters", "list", "--id", "m-2")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "by alice")

	_, stderr, code = f.cmd("deadletters", "redrive", "--queue", queue+".missing", "--amqp-url", testbroker.URL())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "NOT_FOUND")
}
