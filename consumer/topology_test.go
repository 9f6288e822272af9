package consumer

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/partitions"
)

// Queues names every queue a consumer declares, spelt as operators'
// policies and dashboards expect: a topology made by hand from those names
// alone (and the exchange, for partitions) is one a consumer with Topology
// Passive accepts.
func TestQueuesNamesEveryQueueTheConsumerDeclares(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testbroker.PartitionsAtEnd(t, e.queue, 2)
	q := e.queue
	require.Equal(t, []string{q, q + ".retry", q + ".dlq"}, e.newConsumer(e.effectHandler(), nil).Queues())
	custom := e.newConsumer(e.effectHandler(), func(c *Config) { c.RetryQueue, c.DeadLetterQueue = q+".later", q+".dead" })
	require.Equal(t, []string{q, q + ".later", q + ".dead"}, custom.Queues())
	none := e.newConsumer(e.effectHandler(), func(c *Config) { c.Queue = "" })
	require.Nil(t, none.Queues(), "a consumer without a Queue declares none")

	parted := e.newConsumer(e.effectHandler(), func(c *Config) { c.Partitions = 2 })
	require.Equal(t, []string{q + ".p0", q + ".p0.retry", q + ".p1", q + ".p1.retry", q + ".dlq"}, parted.Queues())
	ch := testbroker.Channel(t)
	for _, name := range parted.Queues() {
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(t, err)
	}
	require.NoError(t, ch.ExchangeDeclare(q, partitions.ExchangeType, true, false, false, false, nil))
	passive := e.newConsumer(e.effectHandler(), func(c *Config) { c.Partitions = 2; c.Topology = Passive })
	require.NoError(t, passive.Declare(context.Background()))
}
