// Package partitions is the publisher's side of a partitioned consumer
// (consumer.Config.Partitions): one key's messages in order across worker
// processes.
//
// # The topology
//
// A consumer with Partitions N declares an exchange named after its Queue,
// of type x-consistent-hash (RabbitMQ's rabbitmq_consistent_hash_exchange
// plugin), and N quorum queues behind it, QueueName(Queue, 0) …
// QueueName(Queue, N-1), each bound with the same weight and consumed by
// one process at a time (x-single-active-consumer). The processes running
// the consumer spread the partitions between them and take over those of a
// process that dies.
//
// # Publishing
//
// The exchange hashes the routing key: publish each message with its
// ordering key (an account, an order id) as the routing key, and all of one
// key's messages land in one partition, in the order they were published.
// Route says where to publish for a consumer with or without partitions,
// so that one publisher serves both; Publish publishes there, with the
// mandatory flag:
//
//	dc, err := partitions.Publish(ctx, ch, queue, 8, account, amqp.Publishing{MessageId: id, Body: body})
//
// Put the channel in confirm mode and wait for the confirmation before
// counting a message as sent. An outbox (ledger.Publishing) takes Route's
// exchange and routing key.
//
// # Fixed N
//
// N is fixed for the life of the queues: the exchange's hash ring is made
// of the bindings, and another N would send a key's later messages to
// another partition than its earlier ones. The partitions guide
// (docs/partitions.md) says how partitions move between processes, what
// order is kept across a retry or a redrive, and how to change N.
package partitions
