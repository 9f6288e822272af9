package deadletters_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/retention"
)

// A payload conflict that sat in the dead-letter queue while retention
// deleted the inbox row of the payload applied first: redriven, it would be
// applied as new. Redrive leaves it in the dead-letter queue and says why,
// and still moves a message dead-lettered after the horizon.
func TestRedriveRefusesAMessageThatEnteredTheDeadLetterQueueBeforeTheHorizon(t *testing.T) {
	t.Parallel()
	for name, clean := range map[string]func(e *env){
		// `idem inbox cleanup`: the dead-letter row stays and says when.
		"inbox cleanup": func(e *env) {
			ib, err := inbox.New(inbox.Config{Tables: e.tables})
			require.NoError(t, err)
			_, err = ib.Cleanup(context.Background(), e.pool, inbox.CleanupOptions{OlderThan: 7 * 24 * time.Hour})
			require.NoError(t, err)
		},
		// `idem cleanup`: the dead-letter row goes too; when the message
		// entered the queue is unknown.
		"every table": func(e *env) {
			_, err := retention.Clean(context.Background(), retention.Config{Pool: e.pool, Tables: e.tables, OlderThan: 7 * 24 * time.Hour})
			require.NoError(t, err)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+e.tables.QuotedSchema()+".done (id text, amt int)")
			require.NoError(t, err)
			c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
				Tables: e.tables, Logger: quiet(), QueueType: "classic", ShutdownTimeout: 10 * time.Second})
			require.NoError(t, err)
			type deposit struct {
				Amt int `json:"amt"`
			}
			c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+e.tables.QuotedSchema()+".done VALUES ($1, $2)", m.ID, d.Amt)
				return err
			}))
			require.NoError(t, c.Declare(context.Background()))
			publish := func(id, body string) {
				require.NoError(t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
					MessageId: id, Body: []byte(body), ContentType: "application/json"}))
			}
			count := func(sql string, want int) func() bool {
				return func() bool {
					var n int
					_ = e.pool.QueryRow(context.Background(), sql).Scan(&n)
					return n == want
				}
			}
			run := func(until func() bool) {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- c.Run(ctx) }()
				require.Eventually(t, until, 30*time.Second, 20*time.Millisecond)
				cancel()
				require.NoError(t, <-done)
			}
			publish("x1", `{"amt":1}`)
			run(count("SELECT count(*) FROM "+e.tables.QuotedSchema()+".done", 1))
			publish("x1", `{"amt":999}`)
			run(count("SELECT count(*) FROM "+e.tables.Table("dead_letters")+" WHERE reason = 'payload_conflict'", 1))

			var same bool
			require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT i.seen_at = d.dead_lettered_at FROM "+
				e.tables.Table("inbox")+" AS i, "+e.tables.Table("dead_letters")+" AS d WHERE i.message_id = 'x1'").Scan(&same))
			require.True(t, same, "the conflict's claim recorded its sighting in the dead letter's transaction")

			// Ten days pass: every trace of x1 ages past a 7-day retention.
			// The conflict's claim saw x1's row when it dead-lettered it:
			// the row's last sighting is the dead letter's time.
			_, err = e.pool.Exec(context.Background(), "UPDATE "+e.tables.Table("inbox")+` AS i
				SET received_at = i.received_at - interval '10 days', seen_at = d.dead_lettered_at - interval '10 days'
				FROM `+e.tables.Table("dead_letters")+` AS d WHERE d.message_id = i.message_id`)
			require.NoError(t, err)
			_, err = e.pool.Exec(context.Background(), "UPDATE "+e.tables.Table("dead_letters")+
				" SET dead_lettered_at = dead_lettered_at - interval '10 days'")
			require.NoError(t, err)
			clean(e)

			// A later dead letter, after the horizon, may go back.
			publish("x2", `{"amt":"not a number"}`)
			run(count("SELECT count(*) FROM "+e.tables.Table("dead_letters")+" WHERE message_id = 'x2'", 1))

			res, err := deadletters.Redrive(context.Background(), e.options())
			require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
			require.ErrorContains(t, err, `"x1"`)
			require.Equal(t, 1, res.Refused)
			require.Equal(t, 1, res.Moved, "x2 went back")
			require.Equal(t, []string{"x1"}, ids(e.drain(e.queue+".dlq")))
			var amounts []int
			rows, err := e.pool.Query(context.Background(), "SELECT amt FROM "+e.tables.QuotedSchema()+".done WHERE id = 'x1'")
			require.NoError(t, err)
			amounts, err = pgx.CollectRows(rows, pgx.RowTo[int])
			require.NoError(t, err)
			require.Equal(t, []int{1}, amounts, fmt.Sprintf("x1 applied once: %v", amounts))
		})
	}
}

// A dead letter whose message's row is old enough for retention, but not
// yet deleted, passes the horizon check; a clean-up after the redrive and
// before the consumer takes the message back would delete the row and let
// the copy apply as new. Redrive touches the row as it sends the message
// back, so the clean-up finds it too young, and the conflict comes back as
// a conflict.
func TestRedrivenMessageKeepsItsInboxRowThroughACleanUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, "CREATE TABLE "+e.tables.QuotedSchema()+".done (id text, amt int)")
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
		Tables: e.tables, Logger: quiet(), QueueType: "classic", ShutdownTimeout: 10 * time.Second})
	require.NoError(t, err)
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d struct{ Amt int }) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+e.tables.QuotedSchema()+".done VALUES ($1, $2)", m.ID, d.Amt)
		return err
	}))
	require.NoError(t, c.Declare(ctx))
	count := func(sql string) int {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	conflicts := "SELECT count(*) FROM " + e.tables.Table("dead_letters") + " WHERE reason = 'payload_conflict'"
	run := func(until func() bool) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		require.Eventually(t, until, 30*time.Second, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}
	for _, body := range []string{`{"amt":1}`, `{"amt":999}`} {
		require.NoError(t, e.ch.PublishWithContext(ctx, "", e.queue, false, false, amqp.Publishing{
			MessageId: "x1", Body: []byte(body), ContentType: "application/json"}))
	}
	run(func() bool { return count(conflicts) == 1 })

	// Eight days pass; retention has not run yet.
	_, err = e.pool.Exec(ctx, "UPDATE "+e.tables.Table("inbox")+
		" SET received_at = received_at - interval '8 days', seen_at = seen_at - interval '8 days'")
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, "UPDATE "+e.tables.Table("dead_letters")+" SET dead_lettered_at = dead_lettered_at - interval '8 days'")
	require.NoError(t, err)

	res, err := deadletters.Redrive(ctx, e.options())
	require.NoError(t, err)
	require.Equal(t, 1, res.Moved)
	ib, err := inbox.New(inbox.Config{Tables: e.tables})
	require.NoError(t, err)
	cleaned, err := ib.Cleanup(ctx, e.pool, inbox.CleanupOptions{OlderThan: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.Zero(t, cleaned.Deleted, "the clean-up deleted the row of a message on its way back")

	run(func() bool { return count(conflicts) == 2 })
	require.Equal(t, 1, count("SELECT count(*) FROM "+e.tables.QuotedSchema()+".done WHERE id = 'x1'"), "x1 applied twice")
}
