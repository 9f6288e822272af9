package partitions

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpnames"
)

// ExchangeType is the type of a partitioned consumer's exchange.
const ExchangeType = amqpnames.PartitionExchangeType

// QueueName is the name of partition i of queue: orders.p7 for partition 7
// of orders.
func QueueName(queue string, i int) string { return amqpnames.PartitionQueue(queue, i) }

// Route returns where a message with ordering key key goes for a consumer
// of queue with n partitions: the exchange named queue with key as routing
// key when n > 0, else the queue itself through the default exchange.
func Route(queue string, n int, key string) (exchange, routingKey string) {
	if n > 0 {
		return amqpnames.PartitionExchange(queue), key
	}
	return "", queue
}

// Publish publishes msg with ordering key key for a consumer of queue with
// n partitions (see Route), with the mandatory flag, on ch. Put ch in
// confirm mode first (ch.Confirm) to wait for the broker to store it: the
// returned confirmation says when. An empty queue is an error wrapping
// idem.ErrConfig: with n > 0 it would publish to the default exchange with
// key as routing key, to a queue named like the key. Give msg a MessageId
// made once per message and kept when you publish it again:
// idem.NewMessageID makes a time-ordered one, which costs the consumer's
// inbox least. A msg without one is published as it is (a consumer that
// reads its id from the property dead-letters it).
func Publish(ctx context.Context, ch *amqp.Channel, queue string, n int, key string, msg amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	if queue == "" {
		return nil, fmt.Errorf("partitions: publish: %w: no queue", idem.ErrConfig)
	}
	exchange, routingKey := Route(queue, n, key)
	return ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, msg)
}
