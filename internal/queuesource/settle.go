package queuesource

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/safetext"
)

// Headers the runtime sets on the messages it republishes. They inform
// operators; the runtime itself never reads them back (a publisher controls
// headers): attempt counts and routes live in the attempts table.
const (
	headerAttempt          = "x-idem-attempt"
	headerReason           = "x-idem-reason"
	headerError            = "x-idem-error"
	headerConsumer         = "x-idem-consumer"
	headerOriginalExchange = "x-idem-original-exchange"
	headerOriginalKey      = "x-idem-original-routing-key"
	headerAttempts         = "x-idem-attempts"
	headerPayloadHash      = "x-idem-payload-hash"
	headerStoredHash       = "x-idem-stored-hash"
)

// settle tells the broker what became of each message, after the batch's
// transaction committed: ack processed and duplicate messages; publish dead
// letters and retries with confirms, then ack them; hand unresolved ones
// back. Acks for a dead session are dropped (the broker redelivers, and the
// inbox turns the redelivery into a duplicate).
//
// A dead letter or retry is acked only once the broker confirmed its copy.
// A copy the broker did not store (returned as unroutable, refused with a
// nack, or not confirmed) leaves its message with the broker, and the
// message is counted as unresolved, not as dead-lettered or retried. When
// the broker returned or refused a copy, the session ends and the message
// stays unacked: the broker requeues it when the channel closes, and Run
// reconnects, with backoff (see Run), declaring the queues again.
func (src *Source) settle(ctx context.Context, s *session, batch []*delivery, results []engine.Result) {
	stored := make([]bool, len(batch))
	for i, r := range results {
		stored[i] = r.Outcome == engine.Processed || r.Outcome == engine.Duplicate
	}
	defer func() {
		for _, d := range batch {
			s.gate.give(len(d.d.Body))
		}
		src.held.Store(s.gate.heldBytes())
		src.eng.Count(ctx, countable(results, stored)) // once the broker has been told
	}()
	out, outIdx := src.outgoing(batch, results)
	if !s.alive() {
		src.dropAcks(ctx, len(batch))
		return
	}
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), src.cfg.CommitTimeout)
	defer cancel()
	notStored := false
	if len(out) > 0 {
		fates, err := s.pub.publishAll(settleCtx, out)
		if err != nil {
			src.cfg.Logger.Error("publishing dead letters and retries failed; leaving them for redelivery",
				"consumer", src.cfg.Name, "error", err)
		}
		var nReturned, nRefused int
		for j, i := range outIdx {
			stored[i] = fates[j] == inQueue
			switch fates[j] {
			case returned:
				nReturned++
			case refused:
				nRefused++
			}
		}
		if notStored = nReturned+nRefused > 0; notStored {
			// Leave the messages unacked and reconnect; requeueing them at
			// once would only have them refused again, in a hot loop.
			why := src.notStored(nReturned, nRefused)
			defer s.kill(why)
		}
	}
	src.ack(ctx, s, batch, stored, notStored)
}

// notStored logs, and returns as the reason to end the session, that the
// broker returned nReturned retries or dead letters as unroutable and
// refused nRefused (basic.nack).
func (src *Source) notStored(nReturned, nRefused int) error {
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

// countable is results as they are counted: a dead letter or a retry whose
// copy the broker did not store was handed back, not settled, and counts
// as unresolved.
func countable(results []engine.Result, stored []bool) []engine.Result {
	var out []engine.Result
	for i, r := range results {
		if (r.Outcome == engine.DeadLettered || r.Outcome == engine.Retry) && !stored[i] {
			if out == nil {
				out = slices.Clone(results)
			}
			out[i] = engine.Result{Outcome: engine.Unresolved, Err: r.Err, Inbox: r.Inbox}
		}
	}
	if out == nil {
		return results
	}
	return out
}

// outgoing builds the copies to publish: dead letters and retries.
func (src *Source) outgoing(batch []*delivery, results []engine.Result) (out []outgoing, idx []int) {
	for i, r := range results {
		d := batch[i]
		switch r.Outcome {
		case engine.DeadLettered:
			src.logDeadLetter(d.it, r)
			out = append(out, src.deadLetter(d, r))
			idx = append(idx, i)
		case engine.Retry:
			delay := retry.Backoff(d.it.Attempt, src.cfg.RetryBaseDelay, src.cfg.RetryMaxDelay)
			src.cfg.Logger.Info("handler failed, retrying", "consumer", src.cfg.Name, "message_id", safetext.ShortID(d.it.ID),
				"attempt", d.it.Attempt, "retry_in", delay, "error", safetext.Error(r.Err))
			out = append(out, src.retry(d, r, delay))
			idx = append(idx, i)
		}
	}
	return out, idx
}

// ack acks what is stored and hands back what is not; when notStored, the
// session ends and what is not stored is left unacked instead.
func (src *Source) ack(ctx context.Context, s *session, batch []*delivery, stored []bool, notStored bool) {
	acks := make([]uint64, 0, len(batch))
	var nacks []uint64
	for i, d := range batch {
		switch {
		case stored[i]:
			acks = append(acks, d.d.DeliveryTag)
		case notStored:
			// left unacked: the session ends and the broker requeues it
		default:
			nacks = append(nacks, d.d.DeliveryTag)
		}
	}
	if !s.alive() {
		src.dropAcks(ctx, len(batch))
		return
	}
	err := s.acks.settle(acks, nacks)
	if err == nil && notStored {
		// The session ends: no ack may wait for the tags left unacked,
		// this batch's or, from now on, another worker's.
		err = s.acks.flush()
	}
	if err != nil {
		// finish counts the acks that were not sent when the session ends.
		src.cfg.Logger.Warn("acking failed; the broker redelivers what was not acked",
			"consumer", src.cfg.Name, "error", err)
		s.kill(fmt.Errorf("acking failed: %w", err))
	}
}

// logDeadLetter logs why a message is dead-lettered; conflicts loudly, with
// both hashes.
func (src *Source) logDeadLetter(it *engine.Item, r engine.Result) {
	if r.Reason == deadletters.ReasonPayloadConflict {
		src.cfg.Logger.Error("payload conflict: message id reused with a different payload",
			"consumer", src.cfg.Name, "message_id", safetext.ShortID(it.ID),
			"payload_hash", it.Hash.String(), "stored_hash", r.StoredHash.String())
		return
	}
	src.cfg.Logger.Warn("dead-lettering message", "consumer", src.cfg.Name,
		"message_id", safetext.ShortID(it.ID), "reason", r.Reason, "error", safetext.Error(r.Err))
}

// dropAcks counts n settlements skipped because the session died.
func (src *Source) dropAcks(ctx context.Context, n int) {
	src.eng.Telemetry().AcksDropped(ctx, n)
	src.eng.Counts.AcksDropped.Add(int64(n))
}

// deadLetter is the copy of d published to the dead-letter queue.
func (src *Source) deadLetter(d *delivery, r engine.Result) outgoing {
	p := src.republish(d)
	p.Headers[headerReason] = r.Reason
	p.Headers[headerError] = safetext.Truncate(safetext.Error(r.Err), 1024)
	p.Headers[headerConsumer] = src.cfg.Name
	p.Headers[headerAttempts] = int64(d.it.Attempt)
	p.Headers[headerPayloadHash] = d.it.Hash.String()
	if !r.StoredHash.IsZero() && r.Reason == deadletters.ReasonPayloadConflict {
		p.Headers[headerStoredHash] = r.StoredHash.String()
	}
	return outgoing{queue: src.cfg.DeadLetterQueue, msg: p}
}

// retry is the copy of d parked in the retry queue for delay; the queue's
// dead-letter route brings it back when it expires.
func (src *Source) retry(d *delivery, r engine.Result, delay time.Duration) outgoing {
	p := src.republish(d)
	p.Headers[headerAttempt] = int64(d.it.Attempt + 1)
	p.Headers[headerError] = safetext.Truncate(safetext.Error(r.Err), 1024)
	p.Expiration = strconv.FormatInt(max(delay.Milliseconds(), 1), 10)
	return outgoing{queue: src.cfg.RetryQueue, msg: p}
}

// republish copies d's properties and headers for publishing it again. The
// user id is left out: the broker checks it against the publishing
// connection's user.
func (src *Source) republish(d *delivery) amqp.Publishing {
	headers := make(amqp.Table, len(d.d.Headers)+8)
	for k, v := range d.d.Headers {
		headers[k] = v
	}
	headers[headerOriginalExchange] = d.it.Exchange
	headers[headerOriginalKey] = d.it.RoutingKey
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
