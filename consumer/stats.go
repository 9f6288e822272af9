package consumer

import "sync/atomic"

// Stats counts what a Consumer did since it was created. The same numbers
// are exported as OpenTelemetry metrics; Stats is for health endpoints, logs
// and tests.
type Stats struct {
	// Processed messages ran the handler and committed.
	Processed int64
	// Duplicates were acked without running the handler.
	Duplicates int64
	// Conflicts reused an id with another payload; they are also DeadLettered.
	Conflicts int64
	// DeadLettered messages went to the dead-letter queue with a reason.
	DeadLettered int64
	// Retried messages were parked in the retry queue after a handler error.
	Retried int64
	// Unresolved messages were handed back to the broker after their batch
	// could not commit.
	Unresolved int64
	// AcksDropped counts settlements skipped because their channel had died.
	AcksDropped int64
	// Batches counts committed batch transactions.
	Batches int64
	// Reconnects counts broker reconnects (queues) and stream reader
	// restarts (streams).
	Reconnects int64
	// StreamLag is the stream's sampled tail offset minus the checkpoint
	// (stream consumers only).
	StreamLag int64
}

type counters struct {
	processed, duplicates, conflicts, deadLettered, retried, unresolved, acksDropped, batches, reconnects atomic.Int64
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats {
	k := &c.counts
	lag, _ := c.lag()
	return Stats{
		Processed:    k.processed.Load(),
		Duplicates:   k.duplicates.Load(),
		Conflicts:    k.conflicts.Load(),
		DeadLettered: k.deadLettered.Load(),
		Retried:      k.retried.Load(),
		Unresolved:   k.unresolved.Load(),
		AcksDropped:  k.acksDropped.Load(),
		Batches:      k.batches.Load(),
		Reconnects:   k.reconnects.Load(),
		StreamLag:    lag,
	}
}

// count adds one batch's outcomes to the counters.
func (k *counters) count(results []result) {
	for _, r := range results {
		switch r.outcome {
		case outcomeProcessed:
			k.processed.Add(1)
		case outcomeDuplicate:
			k.duplicates.Add(1)
		case outcomeDeadLettered:
			if r.reason == ReasonPayloadConflict {
				k.conflicts.Add(1)
			}
			k.deadLettered.Add(1)
		case outcomeRetry:
			k.retried.Add(1)
		case outcomeUnresolved:
			k.unresolved.Add(1)
		}
	}
}
