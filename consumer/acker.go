package consumer

import (
	"fmt"
	"sync"
)

// ackChannel is the part of *amqp.Channel the acker needs.
type ackChannel interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// acker settles one channel's deliveries with as few frames as it can. A
// basic.ack with multiple=true settles every outstanding delivery up to its
// tag; batches finish out of delivery order (several workers, ordering
// keys), so the acker remembers which tags are ready and sends one
// multiple ack for the longest run of settled tags starting at the lowest
// unsettled one. It never covers a tag that is not to be acked: a delivery
// still in a batch, one handed back (nacked at once, before any multiple ack
// that could cover it) or one left for redelivery (shutdown, unroutable dead
// letters) blocks the run; acks waiting above it go out one by one when
// there are too many of them (a slow batch must not hold the prefetch window)
// and at flush.
//
// One multiple ack per run instead of one frame per message cuts the
// broker's CPU per message on quorum queues by about a third (BENCHMARKS.md)
// and saves a write per message.
type acker struct {
	ch ackChannel

	mu sync.Mutex
	// low is the lowest tag not yet settled with the broker: every tag
	// below it is acked or nacked.
	low uint64
	// ready holds settled tags above low: true is waiting for an ack, false
	// was already settled one by one (a nack or an individual ack).
	ready map[uint64]bool
	// waiting counts the true entries of ready.
	waiting int
	// maxWaiting is how many acks may wait above an unsettled tag.
	maxWaiting int
}

func newAcker(ch ackChannel, prefetch int) *acker {
	return &acker{ch: ch, low: 1, ready: map[uint64]bool{}, maxWaiting: max(prefetch/2, 1)}
}

// settle acks the tags in acks and hands back (nack, requeue) the tags in
// nacks. Nacks are sent first, so no multiple ack sent now or later covers
// a message that is to be redelivered. An error means the channel failed:
// the caller kills the session, and whatever was not sent is redelivered.
func (a *acker) settle(acks, nacks []uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, tag := range nacks {
		if err := a.ch.Nack(tag, false, true); err != nil {
			return fmt.Errorf("nack %d: %w", tag, err)
		}
		a.ready[tag] = false
	}
	for _, tag := range acks {
		a.ready[tag] = true
		a.waiting++
	}
	var top uint64 // the highest tag of the run that still needs its ack
	for {
		pending, ok := a.ready[a.low]
		if !ok {
			break
		}
		if pending {
			top = a.low
			a.waiting--
		}
		delete(a.ready, a.low)
		a.low++
	}
	if top > 0 {
		if err := a.ch.Ack(top, true); err != nil {
			return fmt.Errorf("ack up to %d: %w", top, err)
		}
	}
	if a.waiting > a.maxWaiting {
		return a.ackWaiting()
	}
	return nil
}

// flush acks every tag that still waits above an unsettled one, one frame
// each. Call it before cancelling the consumer or ending the session on
// purpose, when the tags blocking them will not be settled here.
func (a *acker) flush() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ackWaiting()
}

func (a *acker) ackWaiting() error {
	for tag, pending := range a.ready {
		if !pending {
			continue
		}
		if err := a.ch.Ack(tag, false); err != nil {
			return fmt.Errorf("ack %d: %w", tag, err)
		}
		a.ready[tag] = false
		a.waiting--
	}
	return nil
}
