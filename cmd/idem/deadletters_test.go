package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
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

// Two dead letters with one body and different ids, the older one's row
// deleted by retention: redriving the older one finds no row of its own,
// leaves it in the dead-letter queue, says which and why (exit 1), and
// marks nothing; the other one's row is marked only by its own redrive.
func TestDeadLettersRedriveMatchesEachMessageToItsOwnRowAndSaysWhichItRefused(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t) // its dead-letter row: billing, m-2, payload "m-2", max_attempts
	queue := testbroker.Queue(t)
	ch := testbroker.Channel(t)
	for _, q := range []string{queue, queue + ".dlq"} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	h := idem.HashBytes([]byte("m-2"))
	for _, id := range []string{"m-old", "m-2"} {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", queue+".dlq", false, false, amqp.Publishing{
			MessageId: id, Body: []byte("m-2"), Headers: amqp.Table{deadletters.HeaderReason: "max_attempts",
				deadletters.HeaderConsumer: "billing", deadletters.HeaderPayloadHash: h.String(), deadletters.HeaderMessageID: id}}))
	}
	redrive := func(args ...string) (string, string, int) {
		return f.cmd(append([]string{"deadletters", "redrive", "--queue", queue, "--operator", "alice",
			"--amqp-url", testbroker.URL()}, args...)...)
	}

	out, stderr, code := redrive("--id", "m-old")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "moved 0 of 2 messages looked at from "+queue+".dlq back to "+queue+" (0 dead-letter rows marked); 1 left beyond the inbox horizon")
	require.Regexp(t, `REFUSED MESSAGE ID +CONSUMER +REASON +WHY\nm-old +billing +max_attempts +inbox: beyond the retention horizon: no dead-letter row of consumer "billing" is left for message "m-old"`, out)
	require.Contains(t, stderr, inbox.ErrBeyondHorizon.Error())
	out, stderr, code = f.cmd("deadletters", "list", "--id", "m-2")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "by alice", "m-old's redrive did not mark m-2's row")

	out, _, code = redrive("--json")
	require.Equal(t, 1, code, out)
	var got struct {
		Moved    int `json:"moved"`
		Marked   int `json:"marked"`
		Refused  int `json:"refused"`
		Refusals []struct {
			MessageID string `json:"message_id"`
			Consumer  string `json:"consumer"`
			Reason    string `json:"reason"`
			Error     string `json:"error"`
		} `json:"refusals"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, 1, got.Moved, "m-2 goes back")
	require.Equal(t, 1, got.Marked)
	require.Equal(t, 1, got.Refused)
	require.Len(t, got.Refusals, 1)
	require.Equal(t, "m-old", got.Refusals[0].MessageID)
	require.Equal(t, "billing", got.Refusals[0].Consumer)
	require.Contains(t, got.Refusals[0].Error, inbox.ErrBeyondHorizon.Error())
	out, stderr, code = f.cmd("deadletters", "list", "--id", "m-2")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "by alice", "m-2's own redrive marked its row")
	d, ok, err := ch.Get(queue+".dlq", true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "m-old", d.MessageId, "m-old is still in the dead-letter queue")
}
