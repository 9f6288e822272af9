package consumer

import "github.com/idemkit/idem"

// Stats counts what a Consumer did since it was created. The same numbers
// are exported as OpenTelemetry metrics; Stats is for logs and tests.
//
// The fields that name an outcome (Processed, Duplicates, DeadLettered,
// Retried, Unresolved) are read from ByOutcome, the one tally of outcomes,
// so in a snapshot they always agree with it.
type Stats struct {
	// Processed messages ran the handler and committed.
	Processed int64
	// Duplicates were acked without running the handler.
	Duplicates int64
	// Conflicts reused an id with another payload; they are also DeadLettered.
	Conflicts int64
	// DeadLettered messages got a dead-letter row with a reason (and, from
	// a queue, a copy in the dead-letter queue).
	DeadLettered int64
	// Retried counts handler failures to be tried again: parked in the
	// retry queue (queues), or retried in place (streams, and queues with
	// an ordering key).
	Retried int64
	// Unresolved messages were handed back to the broker after their batch
	// could not commit (with an ordering key, held in place and tried
	// again), or whose retry or dead-letter copy the broker did not store
	// (they stay unacked in the queue).
	Unresolved int64
	// OrderGaps counts the messages a queue consumer with an ordering key
	// (OrderingKey, Partitions) dead-lettered: each is a gap in its key's
	// order, the key's later messages applied without it. They are also
	// DeadLettered.
	OrderGaps int64
	// AcksDropped counts settlements skipped because their channel had died.
	AcksDropped int64
	// Batches counts committed batch transactions.
	Batches int64
	// Reconnects counts broker reconnects (queues) and stream reader
	// restarts (streams).
	Reconnects int64
	// Contention counts batch transactions that conflicted with another over
	// rows (lock timeout, deadlock, serialization failure) and were retried.
	Contention int64
	// AbandonedHandlers counts handlers that ignored their context past
	// HandlerTimeout and were abandoned.
	AbandonedHandlers int64
	// BufferedBytes is what the consumer holds in memory of deliveries not
	// yet settled (at most MaxBufferedBytes, or one larger message).
	BufferedBytes int64
	// StreamLag is the stream's sampled tail offset minus the checkpoint
	// (stream consumers only).
	StreamLag int64
	// ByOutcome counts the messages of every outcome, indexed by
	// idem.Outcome (a payload conflict as DeadLettered): the outcomes the
	// fields above name, and those they do not (Held, Skipped, Postponed).
	ByOutcome [idem.MaxOutcome + 1]int64
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	k := &c.eng.Counts
	lag, _ := c.eng.Lag.Value()
	s := Stats{
		Conflicts:         k.Conflicts.Load(),
		OrderGaps:         k.OrderGaps.Load(),
		AcksDropped:       k.AcksDropped.Load(),
		Batches:           k.Batches.Load(),
		Reconnects:        k.Reconnects.Load(),
		Contention:        k.Contention.Load(),
		AbandonedHandlers: k.Abandoned.Load(),
		StreamLag:         lag,
	}
	for o := range s.ByOutcome {
		s.ByOutcome[o] = k.ByOutcome[o].Load()
	}
	s.nameOutcomes()
	if c.src != nil {
		s.BufferedBytes = c.src.BufferedBytes()
	}
	return s
}

// nameOutcomes fills the fields that name an outcome from ByOutcome, the
// one place they are set.
func (s *Stats) nameOutcomes() {
	s.Processed = s.ByOutcome[idem.Processed]
	s.Duplicates = s.ByOutcome[idem.Duplicate]
	s.DeadLettered = s.ByOutcome[idem.DeadLettered]
	s.Retried = s.ByOutcome[idem.Retried]
	s.Unresolved = s.ByOutcome[idem.Unresolved]
}
