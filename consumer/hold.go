package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/safetext"
)

// keyHold is what one worker of a queue with an ordering key (OrderingKey,
// Partitions) holds back while a message retries. A message whose handler
// failed is not copied to the retry queue: it stays unacked in its worker,
// its bytes in the session's window, with every later delivery of its key
// queued behind it, until its backoff (RetryBaseDelay, RetryMaxDelay, by
// attempt) ends; then they run again, in order. The worker's other keys
// flow meanwhile. The failed attempts are counted in the attempts table,
// like a retry's, so MaxAttempts holds whatever happens to the process: if
// it dies, or its session does, the broker returns the unacked deliveries
// to the head of the queue, in their order, and the next consumer (for a
// partition, its single active one) runs the failed message first — alone,
// as a redelivery — at its next attempt. Shutdown leaves them unacked the
// same way. Once a message is dead-lettered its key moves on (counted in
// Stats.OrderGaps).
//
// A message whose batch did not commit (Unresolved) holds its key the
// same way: handing it back to the broker would let its key's later
// deliveries, already in the process, run first.
//
// It belongs to its worker's goroutine, which stops its timer.
type keyHold struct {
	src  *queueSource
	s    *session
	keys map[string]*heldKey
	// released are deliveries of keys whose turn came, in order: they go
	// into batches before anything still in the worker's input, and never
	// hold a delivery of a held key (see sweep).
	released []*delivery
	timer    *time.Timer
	// newlyHeld reports that the batch running now held a key.
	newlyHeld bool
}

// heldKey is one key held behind its failed message.
type heldKey struct {
	queue []*delivery // the failed message first, then its key's later deliveries
	due   time.Time   // when the failed message runs again
}

// newKeyHold returns the hold of a worker of session s, or nil without an
// ordering key.
func (src *queueSource) newKeyHold(s *session) *keyHold {
	if src.orderingKey == nil {
		return nil
	}
	return &keyHold{src: src, s: s, keys: map[string]*heldKey{}}
}

// stop stops the timer. What is held stays unacked: the broker returns it
// to the queue when the session's channel closes.
func (h *keyHold) stop() {
	if h != nil && h.timer != nil {
		h.timer.Stop()
	}
}

// add queues d behind its key if the key is held, and reports whether it
// did.
func (h *keyHold) add(d *delivery) bool {
	if len(h.keys) == 0 {
		return false
	}
	k, ok := h.keys[d.it.Key]
	if ok {
		k.queue = append(k.queue, d)
		h.park(d.d.DeliveryTag)
	}
	return ok
}

// park tells the session's acker that tags are held back (see
// acker.parked). An error means the channel failed: the session ends.
func (h *keyHold) park(tags ...uint64) {
	if !h.s.alive() {
		return // its acks are dropped (see settle)
	}
	if err := h.s.acks.park(tags...); err != nil {
		h.src.cfg.Logger.Warn("acking failed; the broker redelivers what was not acked",
			"consumer", h.src.cfg.Name, "error", err)
		h.s.kill(fmt.Errorf("acking failed: %w", err))
	}
}

// take releases the keys whose backoff ended and appends to batch, up to
// limit, the deliveries released so far.
func (h *keyHold) take(batch []*delivery, limit int) []*delivery {
	now := time.Now()
	for key, k := range h.keys {
		if !k.due.After(now) {
			h.released = append(h.released, k.queue...)
			delete(h.keys, key)
		}
	}
	n := min(len(h.released), max(limit-len(batch), 0))
	batch = append(batch, h.released[:n]...)
	clear(h.released[:n])
	h.released = h.released[n:]
	if len(h.released) == 0 {
		h.released = nil // let the array go
	}
	return batch
}

// wake returns a channel that receives when the first held key's backoff
// ends; nil when no key is held.
func (h *keyHold) wake() <-chan time.Time {
	var first time.Time
	for _, k := range h.keys {
		if first.IsZero() || k.due.Before(first) {
			first = k.due
		}
	}
	if first.IsZero() {
		return nil
	}
	wait := max(time.Until(first), time.Millisecond)
	if h.timer == nil {
		h.timer = time.NewTimer(wait)
	} else {
		h.timer.Reset(wait)
	}
	return h.timer.C
}

// keep holds the deliveries of batch that its results do not settle
// (Retried, Held, Unresolved), each behind the first of its key, and
// counts them; it returns the others, to settle.
func (h *keyHold) keep(ctx context.Context, batch []*delivery, results []engine.Result) ([]*delivery, []engine.Result) {
	settle, done := batch[:0:0], results[:0:0]
	var held []engine.Result
	var tags []uint64
	now := time.Now()
	for i, r := range results {
		d := batch[i]
		if r.Outcome.Final() {
			settle, done = append(settle, d), append(done, r)
			continue
		}
		held, tags = append(held, r), append(tags, d.d.DeliveryTag)
		k, ok := h.keys[d.it.Key]
		if !ok {
			k = &heldKey{due: now.Add(h.backoff(d, r))}
			h.keys[d.it.Key] = k
			h.newlyHeld = true
		}
		k.queue = append(k.queue, d)
		if r.Outcome != idem.Held {
			d.it.Again()
		}
	}
	if len(held) > 0 {
		h.park(tags...)
		h.src.eng.Count(ctx, held)
	}
	return settle, done
}

// backoff is how long d's key waits before d runs again, after result r:
// a retry waits its attempt's backoff; a message whose batch did not commit
// waits by how many times in a row that happened, and after MaxAttempts of
// them ends the session, which hands everything unacked back to the broker
// in order (its DeliveryLimit bounds what follows).
func (h *keyHold) backoff(d *delivery, r engine.Result) time.Duration {
	cfg := &h.src.cfg
	switch r.Outcome {
	case idem.Retried:
		delay := retry.Backoff(d.it.Attempt, cfg.RetryBaseDelay, cfg.RetryMaxDelay)
		cfg.Logger.Info("handler failed, retrying in place; its key waits", "consumer", cfg.Name,
			"message_id", safetext.ShortID(d.it.ID), "attempt", d.it.Attempt, "retry_in", delay, "error", safetext.Error(r.Err))
		return delay
	case idem.Unresolved:
		d.unresolved++
		if d.unresolved > cfg.MaxAttempts && h.s.alive() {
			h.s.kill(fmt.Errorf("message %s held its key through %d batches in a row that did not commit: %w",
				safetext.ShortID(d.it.ID), d.unresolved, r.Err))
		}
		return retry.Backoff(d.unresolved, cfg.RetryBaseDelay, cfg.RetryMaxDelay)
	default:
		return 0 // Held first: what it waited for is settled
	}
}

// divert queues the deliveries of rest whose key the batch running now
// held behind it, and returns the others.
func (h *keyHold) divert(rest []*delivery) []*delivery {
	if !h.newlyHeld {
		return rest
	}
	out := rest[:0:0]
	for _, d := range rest {
		if !h.add(d) {
			out = append(out, d)
		}
	}
	return out
}

// sweep, once a batch that held keys ended, queues behind them what was
// released of their keys and not taken yet: it comes after the batch's.
func (h *keyHold) sweep() {
	if !h.newlyHeld {
		return
	}
	h.newlyHeld = false
	kept := h.released[:0]
	for _, d := range h.released {
		if !h.add(d) {
			kept = append(kept, d)
		}
	}
	clear(h.released[len(kept):])
	h.released = kept
}

// countGaps counts the dead letters among results that the broker stored:
// their key moves on without them.
func (src *queueSource) countGaps(ctx context.Context, results []engine.Result, stored []bool) {
	n := 0
	for i, r := range results {
		if r.Outcome == idem.DeadLettered && stored[i] {
			n++
		}
	}
	if n > 0 {
		src.eng.Counts.OrderGaps.Add(int64(n))
		src.eng.Telemetry().OrderGaps(ctx, n)
	}
}
