package consumer

import (
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/safetext"
)

// The copies of a message that failed: the dead letter published to the
// dead-letter queue, the retry parked in the retry queue. Their headers
// (package amqpnames declares them, package deadletters documents them)
// inform operators; the runtime never reads them back.

// notStored logs, and returns as the reason to end the session, that the
// broker returned nReturned retries or dead letters as unroutable and
// refused nRefused (basic.nack).
func (src *queueSource) notStored(nReturned, nRefused int) error {
	log := src.cfg.Logger.With("consumer", src.cfg.Name, "retry_queue", src.cfg.RetryQueue,
		"dead_letter_queue", src.cfg.DeadLetterQueue)
	var whys []string
	if nReturned > 0 {
		// The retry or dead-letter queue is gone: reconnecting declares it again.
		log.Error("retry or dead-letter queue unroutable (broker returned the messages); leaving them unacked and reconnecting to declare the queues again",
			"messages", nReturned)
		whys = append(whys, fmt.Sprintf("%d returned as unroutable", nReturned))
	}
	if nRefused > 0 {
		log.Error("broker refused retries or dead letters (negative confirm: a full queue with x-overflow reject-publish, or a broker error); leaving them unacked and reconnecting",
			"messages", nRefused)
		whys = append(whys, fmt.Sprintf("%d refused with a nack", nRefused))
	}
	return fmt.Errorf("%w: %s", errNotStored, strings.Join(whys, ", "))
}

// logDeadLetter logs why a message is dead-lettered; conflicts loudly, with
// both hashes.
func (src *queueSource) logDeadLetter(it *engine.Item, r engine.Result) {
	if r.Reason == deadletters.ReasonPayloadConflict {
		src.cfg.Logger.Error("payload conflict: message id reused with a different payload",
			"consumer", src.cfg.Name, "message_id", safetext.ShortID(it.ID),
			"payload_hash", it.Hash.String(), "stored_hash", r.StoredHash.String())
		return
	}
	src.cfg.Logger.Warn("dead-lettering message", "consumer", src.cfg.Name,
		"message_id", safetext.ShortID(it.ID), "reason", r.Reason, "error", safetext.Error(r.Err))
}

// deadLetter logs why d is dead-lettered and returns its copy for the
// dead-letter queue.
func (src *queueSource) deadLetter(d *delivery, r engine.Result) outgoing {
	src.logDeadLetter(d.it, r)
	p := src.republish(d)
	p.Headers[amqpnames.HeaderReason] = r.Reason
	p.Headers[amqpnames.HeaderError] = safetext.Truncate(safetext.Error(r.Err), 1024)
	p.Headers[amqpnames.HeaderConsumer] = src.cfg.Name
	p.Headers[amqpnames.HeaderMessageID] = d.it.ID // the id its row records, "" for none: Redrive matches by it
	p.Headers[amqpnames.HeaderAttempts] = int64(d.it.Attempt)
	p.Headers[amqpnames.HeaderPayloadHash] = d.it.Hash.String()
	if !r.StoredHash.IsZero() && r.Reason == deadletters.ReasonPayloadConflict {
		p.Headers[amqpnames.HeaderStoredHash] = r.StoredHash.String()
	}
	return outgoing{queue: src.cfg.DeadLetterQueue, msg: p}
}

// retry logs that d's handler failed and returns its copy, parked in the
// retry queue for its backoff; the queue's dead-letter route brings it back
// when it expires. A queue with an ordering key retries in place instead
// (see keyHold).
func (src *queueSource) retry(d *delivery, r engine.Result) outgoing {
	delay := retry.Backoff(d.it.Attempt, src.cfg.RetryBaseDelay, src.cfg.RetryMaxDelay)
	src.cfg.Logger.Info("handler failed, retrying", "consumer", src.cfg.Name, "message_id", safetext.ShortID(d.it.ID),
		"attempt", d.it.Attempt, "retry_in", delay, "error", safetext.Error(r.Err))
	p := src.republish(d)
	p.Headers[amqpnames.HeaderAttempt] = int64(d.it.Attempt + 1)
	p.Headers[amqpnames.HeaderError] = safetext.Truncate(safetext.Error(r.Err), 1024)
	p.Expiration = strconv.FormatInt(max(delay.Milliseconds(), 1), 10)
	return outgoing{queue: src.cfg.RetryQueue, msg: p}
}

// republish copies d's properties and headers for publishing it again,
// with the route the broker delivered it by (whatever headers the
// publisher set under those names). The user id is left out: the broker
// checks it against the publishing connection's user.
func (src *queueSource) republish(d *delivery) amqp.Publishing {
	headers := make(amqp.Table, len(d.d.Headers)+8)
	for k, v := range d.d.Headers {
		headers[k] = v
	}
	headers[amqpnames.HeaderOriginalExchange] = d.it.Exchange
	headers[amqpnames.HeaderOriginalRoutingKey] = d.it.RoutingKey
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.d.ContentType,
		ContentEncoding: d.d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.d.Priority,
		CorrelationId:   d.d.CorrelationId,
		ReplyTo:         d.d.ReplyTo,
		MessageId:       d.d.MessageId,
		Timestamp:       d.d.Timestamp,
		Type:            d.d.Type,
		AppId:           d.d.AppId,
		Body:            d.d.Body,
	}
}
