package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// A source says how its batches run with one policy of its own: a queue
// with Queue (Run, RunAlone), a stream reader or a replay with Ordered
// (RunOrdered), consumer.Process with none (RunWithoutRetries). Each policy
// holds only what its source decides; the engine turns it into the rules
// its batches read, in one place (Queue.rules, Ordered.rules,
// processRules).

// Queue is a queue's policy. A failed message waits in the consumer's retry
// queue, its attempts counted in the attempts table. Without an ordering key
// a message whose first write names a row another batch in flight wrote
// leaves its batch (Postponed) instead of waiting for that batch's locks.
type Queue struct {
	// Ordered says the queue has an ordering key: no message is postponed,
	// so none runs after a later message of its key.
	Ordered bool
	// Abandon, when closed, stops the retries of a failing batch: its broker
	// session died, and its messages are redelivered anyway.
	Abandon <-chan struct{}
	// AfterCommit, when set, runs once each commit returned (tests simulate
	// a crash there).
	AfterCommit func()
}

// rules are q's rules.
func (q Queue) rules(e *Engine) rules {
	return rules{scope: e.cfg.Name, retryQueue: true, postpone: !q.Ordered, abandon: q.Abandon, afterCommit: q.AfterCommit}
}

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

// processRules are consumer.Process's rules: claim and run, nothing more.
func processRules(e *Engine) rules { return rules{scope: e.cfg.Name} }

// rules are what a batch reads of its source's policy. Each field says
// which policy sets it and where the engine reads it.
type rules struct {
	// scope is the inbox scope (all; attempt.go: claim; records.go).
	scope string
	// inbox is how the batch uses the inbox (Ordered.Mode; attempt.go,
	// handlers.go, run.go).
	inbox inboxUse
	// selected picks the messages a repair runs (Ordered.Select;
	// attempt.go: decideFixed).
	selected func(*idem.Message) bool
	// inOrder: once a message is to be retried, the messages after it are
	// Held and nothing after it commits; a split batch whose first half does
	// not settle does not run its second half (Ordered; handlers.go, run.go:
	// split).
	inOrder bool
	// retryQueue keeps failed attempts and original routes in the attempts
	// table (Queue; attempt.go: claim; records.go; run.go: giveUp).
	retryQueue bool
	// postpone lets a message leave its batch rather than wait for another
	// batch's rows (Queue without ordering key; handlers.go: runOne).
	postpone bool
	// asyncCommit commits with synchronous_commit off (a rebuild; attempt.go:
	// beginSQL).
	asyncCommit bool
	// gate is Ordered.Gate (attempt.go: beginSQL).
	gate int64
	// messageContext is Ordered.MessageContext (attempt.go: newBatch;
	// handlers.go: runHandlers).
	messageContext func(context.Context, *Item) context.Context
	// beforeCommit runs last inside the transaction (RunOrdered; attempt.go:
	// commit).
	beforeCommit func(ctx context.Context, tx pgx.Tx, items []*Item, results []Result) error
	// committed runs after a commit succeeded (RunOrdered; attempt.go:
	// commit).
	committed func(items []*Item, results []Result)
	// afterCommit is Queue.AfterCommit (attempt.go: commit).
	afterCommit func()
	// abandon stops a failing batch's retries (Queue.Abandon, RunOrdered's
	// context; run.go, isolate.go).
	abandon <-chan struct{}
}

// inboxUse is how a batch uses the inbox.
type inboxUse uint8

const (
	// inboxClaim claims each message, runs the handlers of the new ones and
	// commits.
	inboxClaim inboxUse = iota
	// inboxLook runs a READ ONLY transaction that is always rolled back: the
	// inbox is looked up, not claimed (a forensic replay).
	inboxLook
	// inboxRerun claims, and runs again the selected messages the inbox
	// already holds (a repair).
	inboxRerun
)

// plan is how one attempt runs.
type plan struct {
	savepoints  bool          // a savepoint per handler
	newClaims   bool          // claim with a plain INSERT (ClaimNewBatch)
	lockTimeout time.Duration // the transaction's lock_timeout
	serial      bool          // take the consumer's batch lock exclusively (see governor)
	fixed       []Result      // results decided before this attempt; zero Outcome: run the item
}

// batchError is a failure of the transaction as a whole: nothing in it is
// known to have committed.
type batchError struct {
	err        error
	contention bool // deadlock, serialization failure or lock timeout
	// foreign reports a conflict over a row no other batch of this process
	// wrote: with another process's batch.
	foreign bool
}

func (e *batchError) Error() string { return "batch: " + e.err.Error() }
func (e *batchError) Unwrap() error { return e.err }

func failed(err error) error { return &batchError{err: err, contention: isContention(err)} }

// isContention reports a deadlock (40P01), a serialization failure (40001)
// or a lock wait past lock_timeout (55P03): concurrent transactions wanted
// the same rows, and a retry, smaller or later, resolves it.
func isContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01" || pgErr.Code == "55P03")
}

// excludeError ends an attempt whose transaction cannot go on because of one
// item: its handler timed out, was abandoned, or tried to end the
// transaction. That item's result is decided; the others run again without it.
type excludeError struct {
	index  int
	result Result
}

func (e *excludeError) Error() string {
	return fmt.Sprintf("message %d of the batch: %v", e.index, e.result.Err)
}

var (
	// errNeedSavepoints abandons an optimistic batch whose handler failed.
	errNeedSavepoints = errors.New("engine: a handler failed; run the batch with savepoints")
	// errAlreadyClaimed abandons a ClaimNewBatch batch that meets a claimed id.
	errAlreadyClaimed = errors.New("engine: a message of the batch is in the inbox; claim it with ClaimBatch")
	// errAbortedByHandler is a handler that returned nil after a failed statement.
	errAbortedByHandler = errors.New("handler returned nil, but a statement it ran failed and aborted the transaction")
)
