package deadletters_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// env is one test's schema, queue (with its .dlq) and broker channel.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	queue  string
	ch     *amqp.Channel
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ch := testbroker.Channel(t)
	// In confirm mode, so deadLetter returns once its message is enqueued.
	require.NoError(t, ch.Confirm(false))
	return &env{t: t, pool: pool, tables: tables, queue: testbroker.Queue(t), ch: ch}
}

// declare declares the queue with args and an empty classic dead-letter queue.
func (e *env) declare(args amqp.Table) { e.declareTyped(args, "classic") }

// declareTyped declares the queue with args and an empty dead-letter queue
// of queueType ("classic" or "quorum", as the consumer declares it).
func (e *env) declareTyped(args amqp.Table, queueType string) {
	e.t.Helper()
	_, err := e.ch.QueueDeclare(e.queue, true, false, false, false, args)
	require.NoError(e.t, err)
	_, err = e.ch.QueueDeclare(e.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": queueType})
	require.NoError(e.t, err)
}

// holds waits until q holds n ready messages: a publish without confirms
// may not be enqueued yet when the next call starts.
func (e *env) holds(q string, n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info, err := e.ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && info.Messages == n
	}, 15*time.Second, 20*time.Millisecond, "%s holds %d messages", q, n)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// deadLetter puts a message in the dead-letter queue and writes its row, the
// way the consumer named consumer does when it dead-letters it for reason. It
// returns once the broker has confirmed the message, so a redrive that starts
// next sees it.
func (e *env) deadLetter(consumer, id, reason string) {
	e.t.Helper()
	body := []byte(fmt.Sprintf(`{"id":%q}`, id))
	h := sha256.Sum256(body)
	_, err := e.pool.Exec(context.Background(), "INSERT INTO "+e.tables.Table("dead_letters")+
		` (consumer, message_id, payload_hash, reason, error, attempts) VALUES ($1, $2, $3, $4, 'boom', 3)`,
		consumer, id, h[:], reason)
	require.NoError(e.t, err)
	confirm, err := e.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.queue+".dlq", false, false, amqp.Publishing{
		MessageId: id, Body: body, ContentType: "application/json", CorrelationId: "corr-" + id,
		DeliveryMode: amqp.Persistent, Timestamp: time.Unix(1700000000, 0),
		Headers: amqp.Table{
			"tenant":                      "t-1",
			"x-idem-reason":               reason,
			"x-idem-error":                "boom",
			"x-idem-consumer":             consumer,
			"x-idem-attempts":             int64(3),
			"x-idem-attempt":              int64(3),
			"x-idem-payload-hash":         hex.EncodeToString(h[:]),
			"x-idem-original-exchange":    "orders",
			"x-idem-original-routing-key": "order.paid",
			"x-idem-publish-id":           "17",
		},
	})
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	acked, err := confirm.WaitContext(ctx)
	require.NoError(e.t, err, "the broker confirms the dead letter %s", id)
	require.True(e.t, acked, "the broker acks the dead letter %s", id)
}

// drain gets every message of q, in order, and acks them.
func (e *env) drain(q string) []amqp.Delivery {
	e.t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := e.ch.Get(q, true)
		require.NoError(e.t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func ids(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.MessageId
	}
	return out
}

// redriven returns the message ids of the rows marked redriven, and by whom.
func (e *env) redriven() map[string]string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT message_id, coalesce(redriven_by, '') FROM "+
		e.tables.Table("dead_letters")+" WHERE redriven_at IS NOT NULL")
	require.NoError(e.t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, by string
		require.NoError(e.t, rows.Scan(&id, &by))
		out[id] = by
	}
	require.NoError(e.t, rows.Err())
	return out
}

func (e *env) options() deadletters.RedriveOptions {
	return deadletters.RedriveOptions{AMQPURL: testbroker.URL(), Pool: e.pool, Tables: e.tables, Queue: e.queue}
}
