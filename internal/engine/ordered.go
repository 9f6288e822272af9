package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/retry"
)

// RunOrdered runs items, consecutive messages of an ordered source, in
// order. A message whose handler fails is retried in place (an ordered
// source has no retry queue) after a backoff, with the messages after it,
// until it succeeds or is dead-lettered (max_attempts); read-only batches
// report the failure instead. The checkpoint written with each transaction
// never passes a message that is not settled: not a retried one, not one of
// a later half of a split batch that has not committed yet. ctx ends the
// retries (a lost lock, shutdown); work outlives shutdown for the batch in
// progress. An Unresolved message (the database keeps failing) ends
// RunOrdered with an error: the source resumes from its checkpoint.
func (e *Engine) RunOrdered(ctx, work context.Context, items []*Item, o Ordered) error {
	last := items[len(items)-1].Offset
	settled := make(map[int64]bool, len(items)) // committed with a final outcome
	p := o.rules(e, ctx.Done())
	p.beforeCommit = func(ctx context.Context, tx pgx.Tx, its []*Item, res []Result) error {
		if o.BeforeCommit != nil {
			if err := o.BeforeCommit(ctx, tx, its, res); err != nil {
				return err
			}
		}
		if o.Checkpoint == nil {
			return nil
		}
		if upTo := settledUpTo(items, last, settled, its, res); upTo >= 0 {
			return o.Checkpoint(ctx, tx, upTo)
		}
		return nil
	}
	p.committed = func(its []*Item, res []Result) {
		for i, r := range res {
			if r.Outcome.Final() {
				settled[its[i].Offset] = true
			}
		}
	}
	pending := items
	for attempt := 1; ; attempt++ {
		batch := pending
		results := e.run(work, batch, &p, make([]Result, len(batch)), false)
		if p.inbox != inboxLook {
			e.Count(work, results)
		}
		pending = nil
		for i, r := range results {
			switch {
			case r.Outcome == idem.Unresolved:
				return fmt.Errorf("engine: batch at offset %d: %w", batch[i].Offset, r.Err)
			case r.Outcome == idem.Held:
				pending = append(pending, batch[i]) // its turn comes after the retried one
			case r.Outcome == idem.Retried && p.inbox != inboxLook:
				it := batch[i]
				e.cfg.Logger.Info("handler failed, retrying in place", "offset", it.Offset,
					"message_id", shortID(it.ID), "attempt", it.Attempt, "error", r.Err)
				it.Attempt++
				pending = append(pending, it)
			case o.Settled != nil:
				if err := o.Settled(batch[i], r); err != nil {
					return err
				}
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if !retry.Sleep(ctx, retry.Backoff(attempt, o.RetryBaseDelay, o.RetryMaxDelay)) {
			return context.Cause(ctx) // the checkpoint stays before the failing message
		}
	}
}

// settledUpTo is the last offset before which every message of the
// original batch is settled, counting those settling in this transaction;
// -1 when none is.
func settledUpTo(items []*Item, last int64, settled map[int64]bool, its []*Item, res []Result) int64 {
	now := make(map[int64]bool, len(its))
	for i, r := range res {
		if r.Outcome.Final() {
			now[its[i].Offset] = true
		}
	}
	for _, it := range items {
		if !settled[it.Offset] && !now[it.Offset] {
			return it.Offset - 1
		}
	}
	return last
}
