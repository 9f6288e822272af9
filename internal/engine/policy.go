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
// with Queue (Run, RunAlone: run.go), a stream reader or a replay with
// Ordered (RunOrdered: ordered.go), consumer.Process with none
// (RunWithoutRetries: run.go). Each policy holds only what its source
// decides, beside the door it comes in by; the engine turns it into the
// rules its batches read (Queue.rules, Ordered.rules, processRules), which
// this file defines with the errors an attempt ends with.

// rules are what a batch reads of its source's policy. Each field says
// which policy sets it and where the engine reads it.
type rules struct {
	// scope is the inbox scope (all; attempt.go: claim; records.go).
	scope string
	// inbox is how the batch uses the inbox (Ordered.Mode; attempt.go,
	// handlers.go, supervisor.go: once, run.go).
	inbox inboxUse
	// selected picks the messages a repair runs (Ordered.Select;
	// attempt.go: decideFixed).
	selected func(*idem.Message) bool
	// inOrder: once a message is to be retried, the messages after it are
	// Held and nothing after it commits; a split batch whose first half does
	// not settle does not run its second half (Ordered; handlers.go, run.go:
	// split).
	inOrder bool
	// byKey: once an item is to be retried, the later items of its key
	// (Item.Key) are Held and none of them commits; a split batch's second
	// half holds the items whose key did not settle in the first (Queue
	// with an ordering key; handlers.go, attempt.go: decideFixed, run.go:
	// split).
	byKey bool
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
	// settled, when set, collects the offsets of the items each commit
	// settled with a final outcome (RunOrdered, whose checkpoint reads it;
	// attempt.go: commit).
	settled map[int64]bool
	// afterCommit is Queue.AfterCommit (attempt.go: commit).
	afterCommit func()
	// abandon stops a failing batch's retries (Queue.Abandon, RunOrdered's
	// context; run.go, supervisor.go: admitted, isolate.go).
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
	// errLayoutChanged abandons a batch whose claim met an inbox converted
	// to the partitioned layout meanwhile; it runs again at once.
	errLayoutChanged = errors.New("engine: the inbox was converted to the partitioned layout; claim again")
	// errAlreadyClaimed abandons a ClaimNewBatch batch that meets a claimed id.
	errAlreadyClaimed = errors.New("engine: a message of the batch is in the inbox; claim it with ClaimBatch")
	// errAbortedByHandler is a handler that returned nil after a failed statement.
	errAbortedByHandler = errors.New("handler returned nil, but a statement it ran failed and aborted the transaction")
)
