package partitions

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ExchangeType is the type of a partitioned consumer's exchange.
const ExchangeType = "x-consistent-hash"

// QueueName is the name of partition i of queue: queue + ".p" + i.
func QueueName(queue string, i int) string { return fmt.Sprintf("%s.p%d", queue, i) }

// Route returns where a message with ordering key key goes for a consumer
// of queue with n partitions: the exchange named queue with key as routing
// key when n > 0, else the queue itself through the default exchange.
func Route(queue string, n int, key string) (exchange, routingKey string) {
	if n > 0 {
		return queue, key
	}
	return "", queue
}

// Publish publishes msg with ordering key key for a consumer of queue with
// n partitions (see Route), with the mandatory flag, on ch. Put ch in
// confirm mode first (ch.Confirm) to wait for the broker to store it: the
// returned confirmation says when.
func Publish(ctx context.Context, ch *amqp.Channel, queue string, n int, key string, msg amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	exchange, routingKey := Route(queue, n, key)
	return ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, msg)
}
