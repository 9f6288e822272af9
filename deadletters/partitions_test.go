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
	"github.com/idemkit/idem/partitions"
)

// A partitioned consumer's dead letters go back through its exchange,
// each with the routing key it was first published with, so to the
// partition of its key, and are applied there.
func TestRedriveOfAPartitionedConsumerGoesBackThroughItsExchangeByKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const parts = 3
	testbroker.PartitionsAtEnd(t, e.queue, parts)
	var accept atomic.Bool
	_, err := e.pool.Exec(context.Background(), "CREATE TABLE "+e.tables.QuotedSchema()+".done (id text, source text, key text)")
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "worker", Pool: e.pool, Queue: e.queue,
		Tables: e.tables, Logger: quiet(), Partitions: parts, OrderingKey: func(m *consumer.Message) string { return m.RoutingKey },
		ShutdownTimeout: 10 * time.Second})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !accept.Load() {
			return consumer.DeadLetter("not_yet", errors.New("the handler is not ready for this message"))
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+e.tables.QuotedSchema()+".done VALUES ($1, $2, $3)", m.ID, m.Source, m.RoutingKey)
		return err
	})
	require.NoError(t, c.Declare(context.Background()))
	require.NoError(t, e.ch.Confirm(false))
	for i := range 6 {
		dc, err := partitions.Publish(context.Background(), e.ch, e.queue, parts, fmt.Sprintf("key-%d", i), amqp.Publishing{
			MessageId: fmt.Sprintf("m-%d", i), Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = dc.WaitContext(context.Background())
		require.NoError(t, err)
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
	run(count("SELECT count(*) FROM "+e.tables.Table("dead_letters"), 6))

	res, err := deadletters.Redrive(context.Background(), deadletters.RedriveOptions{AMQPURL: testbroker.URL(), Pool: e.pool,
		Tables: e.tables, Queue: e.queue, Operator: "bob"})
	require.NoError(t, err)
	require.Equal(t, 6, res.Moved)

	accept.Store(true)
	run(count("SELECT count(*) FROM "+e.tables.QuotedSchema()+".done", 6))
	var wrong int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.tables.QuotedSchema()+
		".done WHERE key <> 'key-' || substr(id, 3)").Scan(&wrong))
	require.Zero(t, wrong, "each message comes back with its own routing key")
	require.Empty(t, e.drain(e.queue+".dlq"))
}
