package deadletters_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

func TestRedriveMovesMatchingMessagesBackWithPropertiesAndHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	e.deadLetter("billing", "m-1", "invalid_amount")
	e.deadLetter("billing", "m-2", "max_attempts")
	e.deadLetter("billing", "m-3", "invalid_amount")
	e.deadLetter("shipping", "m-4", "invalid_amount")

	o := e.options()
	o.Reason, o.Consumer, o.Operator = "invalid_amount", "billing", "alice"
	before := time.Now().Add(-time.Second)
	res, err := deadletters.Redrive(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 4, Moved: 2, Marked: 2}, res)

	require.Equal(t, []string{"m-2", "m-4"}, ids(e.drain(e.queue+".dlq")), "non-matching messages stay, in order")
	moved := e.drain(e.queue)
	require.Equal(t, []string{"m-1", "m-3"}, ids(moved))
	d := moved[0]
	require.Equal(t, `{"id":"m-1"}`, string(d.Body))
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, "corr-m-1", d.CorrelationId)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	require.Equal(t, time.Unix(1700000000, 0), d.Timestamp)
	require.Equal(t, "t-1", d.Headers["tenant"], "the publisher's headers are kept")
	require.Equal(t, "orders", d.Headers["x-idem-original-exchange"], "the original route is kept for the handler")
	require.Equal(t, "order.paid", d.Headers["x-idem-original-routing-key"])
	for _, h := range []string{"x-idem-reason", "x-idem-error", "x-idem-consumer", "x-idem-attempts", "x-idem-attempt",
		"x-idem-payload-hash", "x-idem-publish-id"} {
		require.NotContains(t, d.Headers, h, "a redriven message starts afresh")
	}
	history, ok := d.Headers[deadletters.HistoryHeader].([]any)
	require.True(t, ok, "%#v", d.Headers[deadletters.HistoryHeader])
	require.Len(t, history, 1)
	entry := history[0].(amqp.Table)
	require.Equal(t, "invalid_amount", entry["x-idem-reason"])
	require.Equal(t, "billing", entry["x-idem-consumer"])
	require.Equal(t, "boom", entry["x-idem-error"])
	require.EqualValues(t, 3, entry["x-idem-attempts"])
	require.Equal(t, "alice", entry[deadletters.HistoryRedrivenBy])
	require.Equal(t, e.queue+".dlq", entry[deadletters.HistoryRedrivenFrom])
	at, ok := entry[deadletters.HistoryRedrivenAt].(time.Time)
	require.True(t, ok)
	require.True(t, at.After(before), "%v", at)

	require.Equal(t, map[string]string{"m-1": "alice", "m-3": "alice"}, e.redriven(), "each redrive is recorded on its row")
	recs, err := deadletters.List(context.Background(), e.pool, e.tables, deadletters.Filter{MessageID: "m-1"})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, "alice", recs[0].RedrivenBy)
	require.False(t, recs[0].RedrivenAt.IsZero())
}

func TestRedrivenMessageIsProcessedAfreshByTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var accept atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !accept.Load() {
			return consumer.DeadLetter("not_yet", errors.New("the handler is not ready for this message"))
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+e.tables.QuotedSchema()+".done VALUES ($1, $2)", m.ID, m.Attempt)
		return err
	}
	_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+e.tables.QuotedSchema()+".done (id text, attempt int)")
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
		Tables: e.tables, Logger: quiet(), QueueType: "classic", ShutdownTimeout: 10 * time.Second})
	require.NoError(t, err)
	c.Handle(handler)
	require.NoError(t, c.Declare(context.Background()))
	for i := range 3 {
		require.NoError(t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m-%d", i), Body: []byte(`{}`), ContentType: "application/json"}))
	}
	run := func(until func() bool) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		require.Eventually(t, until, 30*time.Second, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}
	count := func(sql string) func() bool {
		return func() bool {
			var n int
			_ = e.pool.QueryRow(context.Background(), sql).Scan(&n)
			return n == 3
		}
	}
	run(count("SELECT count(*) FROM " + e.tables.Table("dead_letters")))

	res, err := deadletters.Redrive(context.Background(), deadletters.RedriveOptions{AMQPURL: testbroker.URL(), Pool: e.pool, Tables: e.tables,
		Queue: e.queue, Reason: "not_yet", Operator: "bob"})
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 3, Moved: 3, Marked: 3}, res, "the rows the consumer wrote are found")

	accept.Store(true)
	run(count("SELECT count(*) FROM " + e.tables.QuotedSchema() + ".done WHERE attempt = 1"))
	require.Empty(t, e.drain(e.queue+".dlq"))
}

func TestRedriveStopsAtTheLimitAndEndsOnALargeDeadLetterQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	for i := range 50 {
		e.deadLetter("billing", fmt.Sprintf("m-%02d", i), "max_attempts")
	}
	o := e.options()
	o.Limit = 3
	res, err := deadletters.Redrive(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 3, Moved: 3, Marked: 3}, res)
	require.Equal(t, []string{"m-00", "m-01", "m-02"}, ids(e.drain(e.queue)))

	// Nothing matches: every message is looked at once, and all stay.
	o = e.options()
	o.MessageID = "no-such-message"
	res, err = deadletters.Redrive(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 47}, res)
	left := ids(e.drain(e.queue + ".dlq"))
	require.Len(t, left, 47)
	require.Equal(t, "m-03", left[0])
	require.Equal(t, "m-49", left[46], "in their order")
}

func TestRedriveNeverLosesAMessageTheQueueRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A full queue that rejects publishes: the broker nacks the copy.
	e.declare(amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	e.deadLetter("billing", "m-1", "max_attempts")
	res, err := deadletters.Redrive(context.Background(), e.options())
	require.ErrorIs(t, err, deadletters.ErrNotMoved)
	require.Zero(t, res.Moved)
	require.Equal(t, []string{"m-1"}, ids(e.drain(e.queue+".dlq")), "the message stays in the dead-letter queue")
	require.Empty(t, e.redriven(), "and its row is not marked")
}

func TestRedriveToAQueueThatDoesNotExistTouchesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	e.deadLetter("billing", "m-1", "max_attempts")
	o := e.options()
	o.Queue, o.DeadLetterQueue = e.queue+".missing", e.queue+".dlq"
	_, err := deadletters.Redrive(context.Background(), o)
	require.ErrorContains(t, err, "NOT_FOUND")
	require.Equal(t, []string{"m-1"}, ids(e.drain(e.queue+".dlq")))
}

func TestRedriveCutOffAfterTheConfirmLeavesTheMessageInTheDeadLetterQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	e.deadLetter("billing", "m-1", "max_attempts")
	proxy := testbroker.NewProxy(t)
	o := e.options()
	o.AMQPURL = proxy.URL()
	deadletters.SetAfterConfirm(&o, proxy.Sever) // the process dies between the confirm and the ack
	_, err := deadletters.Redrive(context.Background(), o)
	require.Error(t, err)
	e.holds(e.queue+".dlq", 1) // the unacked message returns to the dead-letter queue
	require.Equal(t, []string{"m-1"}, ids(e.drain(e.queue+".dlq")), "never lost")
	require.Equal(t, []string{"m-1"}, ids(e.drain(e.queue)), "and a copy is in the queue: the inbox recognises the duplicate")
}

func TestRedriveKeepsTheMessagesLeftInOrderWithoutRaisingTheirDeliveryCount(t *testing.T) {
	t.Parallel()
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declareTyped(nil, queueType)
			var kept, matching []string
			for i := range 50 {
				id, reason := fmt.Sprintf("o-%02d", i), "max_attempts"
				if i%5 == 2 {
					reason, matching = "invalid_amount", append(matching, id)
				} else {
					kept = append(kept, id)
				}
				e.deadLetter("billing", id, reason)
			}
			e.holds(e.queue+".dlq", 50)

			o := e.options()
			o.MessageID = "no-such-message"
			for range 2 { // a second pass finds what the first left
				res, err := deadletters.Redrive(context.Background(), o)
				require.NoError(t, err)
				require.Equal(t, deadletters.RedriveResult{Scanned: 50}, res)
			}
			// Past the limit, the matching messages stay as the others do.
			o = e.options()
			o.Reason, o.Limit = "invalid_amount", 6
			res, err := deadletters.Redrive(context.Background(), o)
			require.NoError(t, err)
			require.Equal(t, deadletters.RedriveResult{Scanned: 50, Moved: 6, Marked: 6}, res)
			o.Limit = 0
			res, err = deadletters.Redrive(context.Background(), o)
			require.NoError(t, err)
			require.Equal(t, deadletters.RedriveResult{Scanned: 44, Moved: 4, Marked: 4}, res)

			require.Equal(t, matching, ids(e.drain(e.queue)), "moved in their order")
			left := e.drain(e.queue + ".dlq")
			require.Equal(t, kept, ids(left), "kept in their order")
			for _, d := range left {
				require.Zero(t, d.Headers["x-delivery-count"], "%s was never handed back", d.MessageId)
				require.Equal(t, "max_attempts", d.Headers["x-idem-reason"], "%s keeps its headers", d.MessageId)
				require.Equal(t, "corr-"+d.MessageId, d.CorrelationId, "and its properties")
			}
		})
	}
}

func TestRedriveLeavesMessagesArrivingMeanwhileUnseenBehindTheKeptOnes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		e.deadLetter("billing", id, "max_attempts")
	}
	e.holds(e.queue+".dlq", 3)
	o := e.options()
	o.MessageID = "m-2"
	deadletters.SetAfterConfirm(&o, func() { e.deadLetter("billing", "m-2", "max_attempts") })
	res, err := deadletters.Redrive(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 3, Moved: 1, Marked: 1}, res)
	e.holds(e.queue+".dlq", 3)
	require.Equal(t, []string{"m-1", "m-3", "m-2"}, ids(e.drain(e.queue+".dlq")), "the late m-2 matches, but was not looked at")
	require.Equal(t, []string{"m-2"}, ids(e.drain(e.queue)))
}

// A stream has no dead-letter queue: redriving one says so and where its
// dead letters are retried, and moves nothing.
func TestRedriveOfAStreamSaysItHasNoDeadLetterQueueAndHowToRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
	require.NoError(t, err)
	_, err = deadletters.Redrive(context.Background(), e.options())
	require.ErrorIs(t, err, deadletters.ErrNoDeadLetterQueue)
	require.ErrorContains(t, err, "repair replay")
	require.NotContains(t, err.Error(), "still in")
}
