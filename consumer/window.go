package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/engine"
)

// The window of a session is its deliveries that are not settled yet: a
// delivery enters it when the router takes it (take) and leaves it when its
// batch is settled with the broker (settle). The gate (amqpconn.Gate, under
// the consume connection's socket) bounds the window in bytes, the acker
// settles it with as few frames as it can.

// take puts delivery d, which src's router took off the channel, in the
// session's window: the acker will settle its tag (registered before any
// later delivery can be settled), the gate counts its body until it is
// settled.
func (s *session) take(src *queueSource, d *amqp.Delivery) {
	s.acks.deliver(d.DeliveryTag)
	s.gate.Take(len(d.Body))
	src.held.Store(s.gate.Held())
}

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
func (src *queueSource) settle(ctx context.Context, s *session, batch []*delivery, results []engine.Result) {
	stored := make([]bool, len(batch))
	for i, r := range results {
		stored[i] = r.Outcome.Final() && !r.Outcome.Copied() // copies: once the broker confirmed them
	}
	defer func() {
		for _, d := range batch {
			s.gate.Give(len(d.d.Body))
		}
		src.held.Store(s.gate.Held())
		src.eng.Count(ctx, countable(results, stored)) // once the broker has been told
		if src.orderingKey != nil {
			src.countGaps(ctx, results, stored)
		}
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

// outgoing builds the copies to publish: dead letters and retries (see
// copies.go).
func (src *queueSource) outgoing(batch []*delivery, results []engine.Result) (out []outgoing, idx []int) {
	for i, r := range results {
		d := batch[i]
		switch r.Outcome {
		case idem.DeadLettered:
			out = append(out, src.deadLetter(d, r))
			idx = append(idx, i)
		case idem.Retried:
			out = append(out, src.retry(d, r))
			idx = append(idx, i)
		}
	}
	return out, idx
}

// countable is results as they are counted: a dead letter or a retry whose
// copy the broker did not store was handed back, not settled, and counts
// as unresolved.
func countable(results []engine.Result, stored []bool) []engine.Result {
	var out []engine.Result
	for i, r := range results {
		if r.Outcome.Copied() && !stored[i] {
			if out == nil {
				out = slices.Clone(results)
			}
			out[i] = engine.Result{Outcome: idem.Unresolved, Err: r.Err, Inbox: r.Inbox}
		}
	}
	if out == nil {
		return results
	}
	return out
}

// ack acks what is stored and hands back what is not; when notStored, the
// session ends and what is not stored is left unacked instead.
func (src *queueSource) ack(ctx context.Context, s *session, batch []*delivery, stored []bool, notStored bool) {
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

// dropAcks counts n settlements skipped because the session died.
func (src *queueSource) dropAcks(ctx context.Context, n int) {
	src.eng.Telemetry().AcksDropped(ctx, n)
	src.eng.Counts.AcksDropped.Add(int64(n))
}

// ackChannel is the part of *amqp.Channel the acker needs.
type ackChannel interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// acker settles one channel's deliveries with as few frames as it can. A
// basic.ack with multiple=true settles every outstanding delivery up to its
// tag; batches finish out of delivery order (several workers, ordering
// keys), so the acker knows which deliveries are still unsettled and sends
// one multiple ack for every waiting ack below the lowest of them. It never
// covers a delivery that is not to be acked: one still in a batch, one
// handed back (nacked at once, before any multiple ack that could span it)
// or one left for redelivery (never started at shutdown, unroutable dead
// letter) stays unsettled and bounds the multiple ack. When more than half
// the prefetch window waits above an unsettled delivery that has not settled
// for hold, the oldest waiting acks go out one by one until a quarter waits
// (a slow batch must not hold the window); every waiting ack goes out at
// flush. Within hold they keep waiting: the lowest unsettled delivery is
// then usually a message that left its batch because another batch in
// flight wrote its row, and it settles in its worker's next batch. Acking
// one by one meanwhile would cost the broker a frame per message, for most
// messages of a handler whose batches often touch the same rows.
//
// Both sets it keeps are bounded by the prefetch window: the broker stops
// delivering when prefetch deliveries are unacked, and every tag in them is
// unacked. The channel must carry this one consumer only (no basic.get, no
// second consume, no client-side recovery), so that its tags are the
// deliveries passed to deliver.
//
// One multiple ack per batch instead of one frame per message cuts the
// broker's CPU per message on quorum queues by about a third (BENCHMARKS.md)
// and saves a write per message.
type acker struct {
	ch ackChannel

	mu sync.Mutex
	// unsettled holds the delivered tags that were neither acked nor
	// nacked yet; low is at most the lowest of them (next when empty).
	unsettled map[uint64]struct{}
	low, next uint64
	// waiting holds the tags whose ack was not sent yet.
	waiting map[uint64]struct{}
	// maxWaiting is how many acks may wait above an unsettled tag.
	maxWaiting int
	// hold is how long more than maxWaiting acks may wait above the same
	// lowest unsettled delivery, which became the lowest at lowSince;
	// holdTimer sends them one by one when hold ends without a settle.
	hold      time.Duration
	lowSince  time.Time
	holdTimer *time.Timer
	// closing sends every ack at once, one by one: the session is ending
	// and the deliveries blocking a multiple ack will never be settled.
	closing bool
	// parked holds the unsettled tags that a keyHold holds back, for as
	// long as a retry's backoff: while the lowest unsettled delivery is
	// one of them, every waiting ack goes out at once, one by one, rather
	// than keep room in the prefetch window (and come back as a duplicate
	// if the session dies) for that long.
	parked map[uint64]struct{}
	// sent reports that an ack frame went out on the channel.
	sent atomic.Bool
}

// ackHold is the acker's hold: a few batches' time, long enough for a
// message that left its batch to settle in the next one, short enough
// that a hung batch (until HandlerTimeout) can fill the window and idle
// every worker only briefly.
const ackHold = 250 * time.Millisecond

func newAcker(ch ackChannel, prefetch int) *acker {
	return &acker{ch: ch, unsettled: map[uint64]struct{}{}, waiting: map[uint64]struct{}{},
		low: 1, next: 1, maxWaiting: max(prefetch/2, 1), hold: ackHold, lowSince: time.Now()}
}

// deliver registers a delivery, in the order the channel delivered them.
func (a *acker) deliver(tag uint64) {
	a.mu.Lock()
	if len(a.unsettled) == 0 {
		a.lowSince = time.Now() // the lowest unsettled delivery from now on
	}
	a.unsettled[tag] = struct{}{}
	a.next = tag + 1
	a.mu.Unlock()
}

// settle acks the tags in acks and hands back (nack, requeue) the tags in
// nacks. Nacks are sent first, so no multiple ack sent now or later covers
// a message that is to be redelivered. An error means the channel failed:
// the caller ends the session; acks not sent stay counted in unsent.
func (a *acker) settle(acks, nacks []uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, tag := range nacks {
		if err := a.ch.Nack(tag, false, true); err != nil {
			return fmt.Errorf("nack %d: %w", tag, err)
		}
		delete(a.unsettled, tag)
		delete(a.parked, tag)
	}
	for _, tag := range acks {
		delete(a.unsettled, tag)
		delete(a.parked, tag)
		a.waiting[tag] = struct{}{}
	}
	if a.closing {
		return a.ackEach()
	}
	low := a.low
	for a.low < a.next {
		if _, ok := a.unsettled[a.low]; ok {
			break
		}
		a.low++
	}
	if a.low != low {
		a.lowSince = time.Now()
	}
	var top uint64 // the highest waiting tag below every unsettled one
	for tag := range a.waiting {
		if tag < a.low && tag > top {
			top = tag
		}
	}
	if top > 0 {
		if err := a.ch.Ack(top, true); err != nil {
			return fmt.Errorf("ack up to %d: %w", top, err)
		}
		a.sent.Store(true)
		for tag := range a.waiting {
			if tag <= top {
				delete(a.waiting, tag)
			}
		}
	}
	return a.unload()
}

// unload acks every waiting tag one by one when the lowest unsettled
// delivery is parked; else it acks the oldest waiting tags one by one when
// more than maxWaiting wait and the lowest unsettled delivery has not
// settled for hold, and before that, it arms holdTimer to do so then,
// unless a settle does it first.
func (a *acker) unload() error {
	if _, ok := a.parked[a.low]; ok && !a.closing {
		return a.ackEach()
	}
	if a.closing || len(a.waiting) <= a.maxWaiting {
		return nil
	}
	if wait := a.hold - time.Since(a.lowSince); wait > 0 {
		if a.holdTimer == nil {
			a.holdTimer = time.AfterFunc(wait, a.holdEnded)
		}
		return nil
	}
	return a.ackOldest(len(a.waiting) - a.maxWaiting/2)
}

// holdEnded runs on holdTimer. An error means the channel failed: its close
// notification ends the session, and the acks not sent stay counted in
// unsent.
func (a *acker) holdEnded() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holdTimer = nil
	_ = a.unload()
}

// ackOldest acks the n lowest waiting tags with a frame each. The rest
// keep waiting for the multiple ack that follows once the deliveries below
// them settle, which is usually soon: a message that left its batch runs in
// the worker's next one.
func (a *acker) ackOldest(n int) error {
	tags := make([]uint64, 0, len(a.waiting))
	for tag := range a.waiting {
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	for _, tag := range tags[:min(n, len(tags))] {
		if err := a.ch.Ack(tag, false); err != nil {
			return fmt.Errorf("ack %d: %w", tag, err)
		}
		delete(a.waiting, tag)
		a.sent.Store(true)
	}
	return nil
}

// park marks tags, unsettled, as held back for a while (see parked), until
// they are settled; it acks what waits above them if that is now due. An
// error means the channel failed, as for settle.
func (a *acker) park(tags ...uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.parked == nil {
		a.parked = map[uint64]struct{}{}
	}
	for _, tag := range tags {
		if _, ok := a.unsettled[tag]; ok {
			a.parked[tag] = struct{}{}
		}
	}
	return a.unload()
}

// flush acks every waiting tag one by one, and from then on acks as soon as
// settle is called. Call it when the session ends on purpose (shutdown, an
// unroutable dead-letter queue), before cancelling the consumer: the
// deliveries blocking a multiple ack will not be settled on this channel.
func (a *acker) flush() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closing = true
	if a.holdTimer != nil {
		a.holdTimer.Stop()
		a.holdTimer = nil
	}
	return a.ackEach()
}

// unsent is how many acks are still waiting: lost if the session ends now.
func (a *acker) unsent() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.waiting)
}

// ackEach acks every waiting tag with a frame of its own, lowest first.
func (a *acker) ackEach() error {
	return a.ackOldest(len(a.waiting))
}

// alive reports that the session has not died.
func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}
