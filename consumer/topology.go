package consumer

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpnames"
)

// The topology a consumer declares: its queue, a retry queue whose expired
// messages flow back to the queue, and a dead-letter queue. All three are
// of the queue's type, so that with a quorum queue (the default) nothing
// idem declares lives on one node: losing any one node of a cluster loses
// neither a pending retry nor a dead letter, and declaring the topology
// again on another node never meets a queue whose home node is down.

// queues are the queues c's consumer declares: see Consumer.Queues.
func (c *Config) queues() []string {
	if c.Partitions == 0 {
		return []string{c.Queue, c.RetryQueue, c.DeadLetterQueue}
	}
	out := make([]string, 0, 2*c.Partitions+1)
	for i := range c.Partitions {
		p := c.partition(i)
		out = append(out, p.Queue, p.RetryQueue)
	}
	return append(out, c.DeadLetterQueue)
}

// declare sets up the queue, the retry queue and the dead-letter queue on
// ch, as Config.Topology says, and returns the channel to
// go on with: ch, or a channel opened on conn when moving the retry queue
// to the queue's type closed ch (see declareRetryQueue).
func (src *queueSource) declare(conn *amqp.Connection, ch *amqp.Channel) (*amqp.Channel, error) {
	cfg := &src.cfg
	mainArgs := amqp.Table{
		"x-queue-type":              cfg.QueueType,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": cfg.DeadLetterQueue,
	}
	if cfg.QueueType == "quorum" {
		// Backstop for poison messages that crash the worker before it can
		// decide: the broker dead-letters them (x-death reason delivery_limit).
		mainArgs["x-delivery-limit"] = int64(cfg.DeliveryLimit)
	}
	if src.exchange != "" {
		// One process at a time consumes a partition: the broker's fence
		// against two processes both believing they hold it.
		mainArgs["x-single-active-consumer"] = true
	}
	switch {
	case cfg.Topology == Declare:
		if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, mainArgs); err != nil {
			return ch, fmt.Errorf("queue %s: %w", cfg.Queue, err)
		}
		if src.exchange != "" {
			if err := declareExchange(ch, src.exchange); err != nil {
				return ch, err
			}
			if err := ch.QueueBind(cfg.Queue, partitionWeight, src.exchange, false, nil); err != nil {
				return ch, fmt.Errorf("bind %s to %s: %w", cfg.Queue, src.exchange, err)
			}
		}
		var err error
		if ch, err = src.declareRetryQueue(conn, ch); err != nil {
			return ch, err
		}
		if _, err := ch.QueueDeclare(cfg.DeadLetterQueue, true, false, false, false, amqp.Table{"x-queue-type": cfg.QueueType}); err != nil {
			return ch, fmt.Errorf("queue %s: %w", cfg.DeadLetterQueue, err)
		}
		return ch, nil
	case cfg.Topology == Passive:
		for _, q := range []string{cfg.Queue, cfg.RetryQueue, cfg.DeadLetterQueue} {
			if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
				return ch, fmt.Errorf("queue %s: %w", q, err)
			}
		}
		if src.exchange != "" {
			if err := ch.ExchangeDeclarePassive(src.exchange, amqpnames.PartitionExchangeType, true, false, false, false, nil); err != nil {
				return ch, fmt.Errorf("exchange %s: %w", src.exchange, err)
			}
		}
	}
	return ch, nil
}

// partitionWeight is the binding key of every partition queue: the
// consistent-hash exchange reads it as the queue's weight on its ring, and
// one weight for all spreads keys evenly.
const partitionWeight = "1"

// declareExchange declares a partitioned consumer's consistent-hash
// exchange, which hashes each message's routing key.
func declareExchange(ch *amqp.Channel, name string) error {
	if err := ch.ExchangeDeclare(name, amqpnames.PartitionExchangeType, true, false, false, false, nil); err != nil {
		return fmt.Errorf("exchange %s (%s, from the rabbitmq_consistent_hash_exchange plugin): %w", name, amqpnames.PartitionExchangeType, err)
	}
	return nil
}

// retryArgs are the retry queue's arguments: the queue's type, and its
// expired messages dead-lettered back to the queue. A quorum retry queue
// dead-letters at least once (which RabbitMQ allows only with
// reject-publish overflow): a retry that expires while the queue has no
// leader, or as a node goes, is delivered once the queue can take it, and
// never dropped.
func (src *queueSource) retryArgs() amqp.Table {
	args := amqp.Table{
		"x-queue-type":              src.cfg.QueueType,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": src.cfg.Queue,
	}
	if src.cfg.QueueType == "quorum" {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	return args
}

// declareRetryQueue declares the retry queue. A retry queue that exists
// with other arguments (a classic retry queue declared before retry queues
// followed the queue's type) is replaced when it is empty: deleted if
// empty, atomically on the broker (a worker publishing a retry to it at
// that moment gets it back as unroutable, and retries the batch), then
// declared again. One that still holds retries is used as it is, with a
// warning, until a later session finds it empty. Closing ch is how the
// broker refuses a declaration; the channel returned is the one to go on
// with.
func (src *queueSource) declareRetryQueue(conn *amqp.Connection, ch *amqp.Channel) (*amqp.Channel, error) {
	name := src.cfg.RetryQueue
	_, err := ch.QueueDeclare(name, true, false, false, false, src.retryArgs())
	var ae *amqp.Error
	if err == nil || !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		if err != nil {
			return ch, fmt.Errorf("queue %s: %w", name, err)
		}
		return ch, nil
	}
	log := src.cfg.Logger.With("consumer", src.cfg.Name, "retry_queue", name)
	if ch, err = conn.Channel(); err != nil {
		return ch, fmt.Errorf("queue %s: reopen channel: %w", name, err)
	}
	if _, err = ch.QueueDelete(name, false, true, false); err == nil {
		if _, err := ch.QueueDeclare(name, true, false, false, false, src.retryArgs()); err != nil {
			return ch, fmt.Errorf("queue %s: %w", name, err)
		}
		log.Info("retry queue replaced: it was empty and had other arguments", "queue_type", src.cfg.QueueType)
		return ch, nil
	}
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed { // not "not empty"
		return ch, fmt.Errorf("queue %s: replace: %w", name, err)
	}
	if ch, err = conn.Channel(); err != nil {
		return ch, fmt.Errorf("queue %s: reopen channel: %w", name, err)
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return ch, fmt.Errorf("queue %s: %w", name, err)
	}
	log.Warn("retry queue has other arguments than idem declares (a classic queue lives on one node); "+
		"it is replaced once empty, at a later session", "messages", q.Messages, "queue_type", src.cfg.QueueType)
	return ch, nil
}
