// Package partitions is the publisher's side of a partitioned consumer
// (consumer.Config.Partitions): per-key order across worker processes.
//
// A consumer with Partitions N declares an exchange named after its Queue,
// of type x-consistent-hash (RabbitMQ's rabbitmq_consistent_hash_exchange
// plugin), and N quorum queues behind it, QueueName(Queue, 0) …
// QueueName(Queue, N-1), each bound with the same weight and consumed by
// one process at a time (x-single-active-consumer). The exchange hashes
// the routing key: publish each message with its ordering key (an account,
// an order id) as the routing key, and all of one key's messages land in
// one partition, in the order they were published. Route says where to
// publish for a consumer with or without partitions; Publish publishes
// there.
//
// N is fixed for the life of the queues: the exchange's hash ring is made of
// the bindings, and changing N would send a key's later messages to
// another partition than its earlier ones.
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
