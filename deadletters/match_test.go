package deadletters_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/retention"
)

// depositWorker is a consumer "worker" on e's queue whose handler records
// each deposit it applies in the table done (id, amt).
type depositWorker struct {
	e *env
	c *consumer.Consumer
}

func newDepositWorker(e *env) *depositWorker {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+e.tables.QuotedSchema()+".done (id text, amt int)")
	require.NoError(e.t, err)
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
		Tables: e.tables, Logger: quiet(), QueueType: "classic", ShutdownTimeout: 10 * time.Second})
	require.NoError(e.t, err)
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d struct{ Amt int }) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+e.tables.QuotedSchema()+".done VALUES ($1, $2)", m.ID, d.Amt)
		return err
	}))
	require.NoError(e.t, c.Declare(context.Background()))
	return &depositWorker{e: e, c: c}
}

func (w *depositWorker) publish(id, body string) {
	w.e.t.Helper()
	require.NoError(w.e.t, w.e.ch.PublishWithContext(context.Background(), "", w.e.queue, false, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), ContentType: "application/json"}))
}

// runUntil runs the worker until the query sql counts want rows.
func (w *depositWorker) runUntil(sql string, want int) {
	w.e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.c.Run(ctx) }()
	require.Eventually(w.e.t, func() bool { return w.e.count(sql) == want }, 30*time.Second, 20*time.Millisecond, "%s = %d", sql, want)
	cancel()
	require.NoError(w.e.t, <-done)
}

// amounts returns the amounts applied under id, in no particular order.
func (w *depositWorker) amounts(id string) []int {
	w.e.t.Helper()
	rows, err := w.e.pool.Query(context.Background(), "SELECT amt FROM "+w.e.tables.QuotedSchema()+".done WHERE id = $1 ORDER BY amt", id)
	require.NoError(w.e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(w.e.t, err)
	return out
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// seenAt is the last sighting of consumer's inbox row of id (its first
// claim until a later copy is seen).
func (e *env) seenAt(consumer, id string) time.Time {
	e.t.Helper()
	var at time.Time
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT coalesce(seen_at, received_at) FROM "+e.tables.Table("inbox")+
		" WHERE consumer = $1 AND message_id = $2", consumer, id).Scan(&at))
	return at
}

// redrivenBy returns, for each dead-letter row of id (oldest first), who
// marked it redriven ("-" when not marked).
func (e *env) redrivenBy(id string) []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT CASE WHEN redriven_at IS NULL THEN '-' ELSE coalesce(redriven_by, '') END FROM "+
		e.tables.Table("dead_letters")+" WHERE message_id = $1 ORDER BY id", id)
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(e.t, err)
	return out
}

// conflictTwins makes two payload conflicts with identical bodies and
// different ids, x1 dead-lettered before y1, then ages every trace of x1
// past a 7-day retention and runs `idem cleanup`, which deletes x1's inbox
// row and its dead-letter row: only y1's dead-letter row holds the payload
// hash both copies in the dead-letter queue carry.
func conflictTwins(t *testing.T) (*env, *depositWorker) {
	e := newEnv(t)
	w := newDepositWorker(e)
	done := "SELECT count(*) FROM " + e.tables.QuotedSchema() + ".done"
	conflicts := "SELECT count(*) FROM " + e.tables.Table("dead_letters") + " WHERE reason = 'payload_conflict'"
	w.publish("x1", `{"amt":1}`)
	w.publish("y1", `{"amt":2}`)
	w.runUntil(done, 2)
	w.publish("x1", `{"amt":999}`)
	w.runUntil(conflicts, 1)
	w.publish("y1", `{"amt":999}`)
	w.runUntil(conflicts, 2)
	e.holds(e.queue+".dlq", 2)

	ctx := context.Background()
	_, err := e.pool.Exec(ctx, "UPDATE "+e.tables.Table("inbox")+
		" SET received_at = received_at - interval '10 days', seen_at = seen_at - interval '10 days' WHERE message_id = 'x1'")
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, "UPDATE "+e.tables.Table("dead_letters")+
		" SET dead_lettered_at = dead_lettered_at - interval '10 days' WHERE message_id = 'x1'")
	require.NoError(t, err)
	res, err := retention.Clean(ctx, retention.Config{Pool: e.pool, Tables: e.tables, OlderThan: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Deleted("inbox"), "x1's inbox row")
	require.EqualValues(t, 1, res.Deleted("dead_letters"), "x1's dead-letter row")
	require.Equal(t, []string{"-"}, e.redrivenBy("y1"))
	return e, w
}

// Two dead letters with identical bodies and different ids; retention
// deleted the older one's rows. However it is selected (by id, by reason,
// or with everything), the older one is matched to its own rows by
// (consumer, message id), finds none, and stays in the dead-letter queue,
// refused: moved, it would be applied as new. The other one's rows are
// never touched on its behalf, and it goes back marking its own row.
func TestRedriveMatchesEachDeadLetterToItsOwnRowsNeverAnotherWithTheSamePayload(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]func(o *deadletters.RedriveOptions){
		"by id":     func(o *deadletters.RedriveOptions) { o.MessageID = "x1" },
		"by reason": func(o *deadletters.RedriveOptions) { o.Reason = deadletters.ReasonPayloadConflict },
		"all":       func(o *deadletters.RedriveOptions) {},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e, w := conflictTwins(t)
			seen := e.seenAt("worker", "y1")

			o := e.options()
			o.Operator = "alice"
			first(&o)
			res, err := deadletters.Redrive(context.Background(), o)
			require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
			require.ErrorContains(t, err, `"x1"`)
			require.Equal(t, 1, res.Refused)
			require.Len(t, res.Refusals, 1)
			require.Equal(t, "x1", res.Refusals[0].MessageID)
			require.Equal(t, "worker", res.Refusals[0].Consumer)
			require.ErrorIs(t, res.Refusals[0].Err, inbox.ErrBeyondHorizon)
			if o.MessageID == "x1" {
				require.Zero(t, res.Moved)
				require.Zero(t, res.Marked)
				require.Equal(t, []string{"-"}, e.redrivenBy("y1"), "y1's dead-letter row is not x1's")
				require.True(t, e.seenAt("worker", "y1").Equal(seen), "y1's inbox row is not x1's")

				o.MessageID = "y1" // the other one goes back on its own
				res, err = deadletters.Redrive(context.Background(), o)
				require.NoError(t, err)
				require.Zero(t, res.Refused)
			}
			require.Equal(t, 1, res.Moved)
			require.Equal(t, 1, res.Marked)
			require.Equal(t, []string{"alice"}, e.redrivenBy("y1"), "y1's own dead-letter row is marked")
			require.True(t, e.seenAt("worker", "y1").After(seen), "and its own inbox row touched")

			// y1 comes back as the conflict it is; x1 never came back.
			conflicts := "SELECT count(*) FROM " + e.tables.Table("dead_letters") + " WHERE reason = 'payload_conflict'"
			w.runUntil(conflicts, 2)
			require.Equal(t, []int{1}, w.amounts("x1"), "x1's conflicting payload was not applied")
			require.Equal(t, []int{2}, w.amounts("y1"))
			dlq := e.drain(e.queue + ".dlq")
			require.Equal(t, []string{"x1", "y1"}, ids(dlq), "x1 stays; y1 is dead-lettered again")
		})
	}
}

// A message the broker dead-lettered itself (a quorum queue's delivery
// limit) names no consumer of idem's: it is judged for the consumer the
// operator names, by its message-id property. Its x-idem- headers, here
// left by someone who shovelled an old dead letter back by hand, are a
// publisher's and steer nothing: it marks its own dead-letter row (one idem
// wrote when it dead-lettered the message before), not the row those
// headers name, and touches its own inbox row.
func TestRedriveOfABrokerDeadLetterMarksItsOwnRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declareTyped(amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(1),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.queue + ".dlq"}, "classic")
	ctx := context.Background()
	body := []byte(`{"amt":5}`)
	h := idem.HashBytes(body)
	ib, err := inbox.New(inbox.Config{Tables: e.tables})
	require.NoError(t, err)
	for _, id := range []string{"m-a", "m-b"} {
		_, err := e.pool.Exec(ctx, "INSERT INTO "+e.tables.Table("dead_letters")+
			` (consumer, message_id, payload_hash, reason, error, attempts) VALUES ('worker', $1, $2, 'max_attempts', 'boom', 3)`, id, h[:])
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := ib.Claim(ctx, tx, inbox.Claim{Consumer: "worker", MessageID: id, PayloadHash: h, Source: e.queue})
			return err
		}))
	}
	_, err = e.pool.Exec(ctx, "UPDATE "+e.tables.Table("inbox")+" SET received_at = received_at - interval '1 day', seen_at = received_at - interval '1 day'")
	require.NoError(t, err)
	seenA, seenB := e.seenAt("worker", "m-a"), e.seenAt("worker", "m-b")

	require.NoError(t, e.ch.PublishWithContext(ctx, "", e.queue, false, false, amqp.Publishing{MessageId: "m-b", Body: body,
		Headers: amqp.Table{deadletters.HeaderConsumer: "worker", deadletters.HeaderReason: "max_attempts",
			deadletters.HeaderMessageID: "m-a", deadletters.HeaderPayloadHash: h.String()}}))
	e.holds(e.queue, 1)
	require.Eventually(t, func() bool { // handed back until the broker dead-letters it
		if d, ok, err := e.ch.Get(e.queue, false); err == nil && ok {
			require.NoError(t, d.Nack(false, true))
		}
		info, err := e.ch.QueueDeclarePassive(e.queue+".dlq", true, false, false, false, nil)
		return err == nil && info.Messages == 1
	}, 15*time.Second, 20*time.Millisecond)

	o := e.options()
	o.Consumer, o.Operator, o.Reason = "worker", "bob", "delivery_limit"
	res, err := deadletters.Redrive(ctx, o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 1, Moved: 1, Marked: 1}, res)
	require.Equal(t, []string{"bob"}, e.redrivenBy("m-b"), "its own row")
	require.Equal(t, []string{"-"}, e.redrivenBy("m-a"), "not the row its headers name")
	require.True(t, e.seenAt("worker", "m-b").After(seenB), "its own inbox row is touched")
	require.True(t, e.seenAt("worker", "m-a").Equal(seenA))
	moved := e.drain(e.queue)
	require.Equal(t, []string{"m-b"}, ids(moved))
	history := moved[0].Headers[deadletters.HistoryHeader].([]any)
	require.Contains(t, history[0].(amqp.Table), "x-death", "the broker's dead-lettering is in its history")
}

// A broker dead letter whose consumer nobody names cannot be judged: it
// stays, and the refusal says to name the consumer.
func TestRedriveRefusesABrokerDeadLetterWithoutAConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	require.NoError(t, e.ch.PublishWithContext(context.Background(), "", e.queue+".dlq", false, false, amqp.Publishing{
		MessageId: "m-1", Body: []byte(`{}`), Headers: amqp.Table{"x-death": []any{amqp.Table{"queue": e.queue,
			"reason": "delivery_limit", "count": int64(1), "time": time.Now()}}}}))
	e.holds(e.queue+".dlq", 1)
	res, err := deadletters.Redrive(context.Background(), e.options())
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	require.Equal(t, 1, res.Refused)
	require.Len(t, res.Refusals, 1)
	require.Equal(t, "m-1", res.Refusals[0].MessageID)
	require.True(t, errors.Is(res.Refusals[0].Err, inbox.ErrBeyondHorizon))
	require.ErrorContains(t, res.Refusals[0].Err, "Consumer")
	require.Equal(t, []string{"m-1"}, ids(e.drain(e.queue+".dlq")))
}

// A consumer that derives its ids from the body (consumer.IDFromJSONField)
// dead-letters copies whose message-id property is not the id their rows
// record; the copy names that id (HeaderMessageID), and Redrive selects and
// matches it by it. A message without any id is matched by the "sha256:"
// id its row records.
func TestRedriveOfAConsumerThatDerivesIdsMatchesTheIdItsRowRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
		Tables: e.tables, Logger: quiet(), QueueType: "classic", ShutdownTimeout: 10 * time.Second,
		MessageID: consumer.IDFromJSONField("order")})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.DeadLetter("not_yet", errors.New("the handler is not ready for this message"))
	})
	require.NoError(t, c.Declare(ctx))
	for _, m := range []amqp.Publishing{
		{MessageId: "same-property", Body: []byte(`{"order":"o-1"}`)},
		{MessageId: "same-property", Body: []byte(`{"order":"o-2"}`)},
		{Body: []byte(`{"amt":7}`)},
	} {
		require.NoError(t, e.ch.PublishWithContext(ctx, "", e.queue, false, false, m))
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	require.Eventually(t, func() bool { return e.count("SELECT count(*) FROM "+e.tables.Table("dead_letters")) == 3 },
		30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	e.holds(e.queue+".dlq", 3)
	noID := "sha256:" + idem.HashBytes([]byte(`{"amt":7}`)).String()

	o := e.options()
	o.MessageID, o.Operator = "o-2", "carol"
	res, err := deadletters.Redrive(ctx, o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 3, Moved: 1, Marked: 1}, res)
	o.MessageID = noID
	res, err = deadletters.Redrive(ctx, o)
	require.NoError(t, err)
	require.Equal(t, deadletters.RedriveResult{Scanned: 2, Moved: 1, Marked: 1}, res)

	require.Equal(t, []string{"-"}, e.redrivenBy("o-1"))
	require.Equal(t, []string{"carol"}, e.redrivenBy("o-2"))
	require.Equal(t, []string{"carol"}, e.redrivenBy(noID))
	moved := e.drain(e.queue)
	require.Len(t, moved, 2)
	require.Equal(t, `{"order":"o-2"}`, string(moved[0].Body))
	require.Equal(t, `{"amt":7}`, string(moved[1].Body))
	left := e.drain(e.queue + ".dlq")
	require.Len(t, left, 1)
	require.Equal(t, `{"order":"o-1"}`, string(left[0].Body))
}
