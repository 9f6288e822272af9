package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/retry"
)

// Ordered is the policy of an ordered source (a stream reader, a replay):
// consecutive messages run in order, and a failed one is retried in place
// with the messages after it (RunOrdered).
type Ordered struct {
	// Mode is how the batches use the inbox. Live (a stream reader) and
	// Normal claim each message and run the new ones. Rebuild claims in
	// Scope and commits with synchronous_commit off: a crash loses the
	// checkpoint with the writes it covers. Forensic looks the messages up
	// in a READ ONLY transaction that is always rolled back, and runs every
	// valid message's handler. Repair claims, and runs again the selected
	// messages the inbox already holds.
	Mode idem.Mode
	// Scope is the inbox scope; the engine's Config.Name when empty.
	Scope string
	// Select, for Repair only, picks the messages to run; the others are
	// Skipped, untouched.
	Select func(*idem.Message) bool
	// Gate, when non-zero, is an advisory lock each transaction takes in
	// shared mode as it begins, in the BEGIN round trip (waiting at most
	// HandlerTimeout). A session that takes it exclusively — a rebuild
	// swapping its tables in — waits for the batches in flight and holds
	// the next ones at their start, before they touch anything.
	Gate int64
	// MessageContext, when set, decorates each message's handler context; a
	// batch with it runs message by message, never through the batch
	// handler.
	MessageContext func(context.Context, *Item) context.Context
	// BeforeCommit, when set, runs inside each transaction, after the
	// engine's writes and before the checkpoint, with the results. An error
	// fails the transaction, which is retried; one made with Stop ends the
	// run instead.
	BeforeCommit func(ctx context.Context, tx pgx.Tx, items []*Item, results []Result) error
	// Checkpoint, when set, records inside each batch transaction that every
	// message up to offset upTo is settled.
	Checkpoint func(ctx context.Context, tx pgx.Tx, upTo int64) error
	// Settled is called once per message, in order, with its final result
	// (Processed, Duplicate, DeadLettered, Skipped; read-only also Retried).
	// An error stops RunOrdered.
	Settled func(it *Item, r Result) error
	// RetryBaseDelay and RetryMaxDelay bound the backoff before a failed
	// message is tried again in place.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

// rules are o's rules; abandon stops a failing batch's retries.
func (o *Ordered) rules(e *Engine, abandon <-chan struct{}) rules {
	r := rules{scope: o.Scope, inOrder: true, gate: o.Gate, messageContext: o.MessageContext, abandon: abandon}
	if r.scope == "" {
		r.scope = e.cfg.Name
	}
	switch o.Mode {
	case idem.Live, idem.Normal:
	case idem.Rebuild:
		r.asyncCommit = true
	case idem.Forensic:
		r.inbox = inboxLook
	case idem.Repair:
		r.inbox, r.selected = inboxRerun, o.Select
	default:
		panic(fmt.Sprintf("engine: ordered mode %q", o.Mode))
	}
	if o.Select != nil && o.Mode != idem.Repair {
		panic("engine: Select is for Repair only")
	}
	return r
}

// Stop marks err, returned by an Ordered.BeforeCommit, as the end of the
// run: the transaction rolls back, the batch is neither retried nor split,
// and RunOrdered returns an error that wraps err.
func Stop(err error) error { return &stopError{err} }

// stopError is an error made with Stop.
type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

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
	p.settled = settled
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
