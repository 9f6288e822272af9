// Package amqpnames is the one home of the names idem gives things on the
// broker: the queues a consumer declares beside its queue (a retry queue, a
// dead-letter queue, the partition queues and their exchange), the headers
// idem writes on the copies it publishes (x-idem-*), and the reading of the
// header the broker writes when it dead-letters a message (x-death, in
// deaths.go).
//
// The public faces (consumer.Config's defaults, package partitions,
// deadletters.QueueName and deadletters.Header*) are defined from these
// declarations, so that a name changes in one place. A test of this
// package fails when another library file spells one of them.
package amqpnames

import (
	"strconv"
	"strings"
)

// Suffixes of the queues a consumer of a queue declares beside it.
const (
	retrySuffix      = ".retry"
	deadLetterSuffix = ".dlq"
	partitionInfix   = ".p"
)

// RetryQueue is the retry queue of queue (consumer.Config.RetryQueue's
// default): queue + ".retry".
func RetryQueue(queue string) string { return queue + retrySuffix }

// DeadLetterQueue is the dead-letter queue of queue
// (consumer.Config.DeadLetterQueue's default): queue + ".dlq".
func DeadLetterQueue(queue string) string { return queue + deadLetterSuffix }

// PartitionQueue is partition i of the partitioned consumer of queue:
// queue + ".p" + i.
func PartitionQueue(queue string, i int) string { return queue + partitionInfix + strconv.Itoa(i) }

// IsPartitionQueue reports whether name is one of queue's partition queues
// (PartitionQueue of queue and some i ≥ 0, spelt as PartitionQueue spells
// it).
func IsPartitionQueue(queue, name string) bool {
	rest, ok := strings.CutPrefix(name, queue+partitionInfix)
	if !ok || rest == "" {
		return false
	}
	i, err := strconv.Atoi(rest)
	return err == nil && i >= 0 && PartitionQueue(queue, i) == name
}

// PartitionExchange is the exchange in front of the partitions of the
// partitioned consumer of queue: it is named after the queue, so that a
// publisher sends to the name it knows.
func PartitionExchange(queue string) string { return queue }

// PartitionExchangeType is the type of PartitionExchange, from RabbitMQ's
// rabbitmq_consistent_hash_exchange plugin: it hashes the routing key.
const PartitionExchangeType = "x-consistent-hash"

// Queues are the queues a consumer of queue with partitions partitions (0
// for none) declares by default: its queue or its partition queues, each
// followed by its retry queue, then the dead-letter queue.
func Queues(queue string, partitions int) []string {
	if partitions <= 0 {
		return []string{queue, RetryQueue(queue), DeadLetterQueue(queue)}
	}
	out := make([]string, 0, 2*partitions+1)
	for i := range partitions {
		p := PartitionQueue(queue, i)
		out = append(out, p, RetryQueue(p))
	}
	return append(out, DeadLetterQueue(queue))
}

// HeaderPrefix starts every header idem writes. A header under it on a
// message idem did not publish was set by its publisher.
const HeaderPrefix = "x-idem-"

// Headers the runtime sets on the copies it publishes to a retry or a
// dead-letter queue; package deadletters documents them for users, under
// the same names.
const (
	// HeaderReason is why the message was dead-lettered.
	HeaderReason = "x-idem-reason"
	// HeaderError is the handler's error, or the dead letter's cause.
	HeaderError = "x-idem-error"
	// HeaderConsumer is the consumer that dead-lettered it.
	HeaderConsumer = "x-idem-consumer"
	// HeaderAttempts is how many times it was tried, on a dead letter.
	HeaderAttempts = "x-idem-attempts"
	// HeaderAttempt is the attempt it is parked for, on a retry.
	HeaderAttempt = "x-idem-attempt"
	// HeaderPayloadHash is its payload hash, in hex.
	HeaderPayloadHash = "x-idem-payload-hash"
	// HeaderMessageID is, on a dead letter, the message id its row records.
	HeaderMessageID = "x-idem-message-id"
	// HeaderStoredHash is the hash the inbox holds under its id, on a
	// payload conflict.
	HeaderStoredHash = "x-idem-stored-hash"
	// HeaderOriginalExchange is the exchange it was first published to.
	HeaderOriginalExchange = "x-idem-original-exchange"
	// HeaderOriginalRoutingKey is the routing key it was first published
	// with.
	HeaderOriginalRoutingKey = "x-idem-original-routing-key"
	// HeaderPublishID correlates a copy the broker returned as unroutable
	// with the consumer's publish of it.
	HeaderPublishID = "x-idem-publish-id"
)

// Headers Redrive writes on the messages it moves back.
const (
	// HeaderHistory holds a redriven message's past: one table per redrive.
	HeaderHistory = "x-idem-history"
	// HeaderRedrivenAt is when a history entry's redrive happened.
	HeaderRedrivenAt = "x-idem-redriven-at"
	// HeaderRedrivenBy is who redrove it.
	HeaderRedrivenBy = "x-idem-redriven-by"
	// HeaderRedrivenFrom is the dead-letter queue it came from.
	HeaderRedrivenFrom = "x-idem-redriven-from"
)
