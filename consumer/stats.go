package consumer

import "github.com/idemkit/idem"

// Stats counts what a Consumer did since it was created. The same numbers
// are exported as OpenTelemetry metrics; Stats is for logs and tests.
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
	// retry queue (queues), or retried in place (streams).
	Retried int64
	// Unresolved messages were handed back to the broker after their batch
	// could not commit, or whose retry or dead-letter copy the broker did
	// not store (they stay unacked in the queue).
	Unresolved int64
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
	// idem.Outcome (a payload conflict as DeadLettered): the fields above
	// and the outcomes they do not name (Held, Skipped, Postponed).
	ByOutcome [idem.MaxOutcome + 1]int64
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	k := &c.eng.Counts
	lag, _ := c.eng.Lag.Value()
	s := Stats{
		Processed:         k.Processed.Load(),
		Duplicates:        k.Duplicates.Load(),
		Conflicts:         k.Conflicts.Load(),
		DeadLettered:      k.DeadLettered.Load(),
		Retried:           k.Retried.Load(),
		Unresolved:        k.Unresolved.Load(),
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
	if c.src != nil {
		s.BufferedBytes = c.src.BufferedBytes()
	}
	return s
}
