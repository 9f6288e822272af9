package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Policy is how one source's batches run: everything the engine does
// differently for a queue (QueuePolicy), a live stream (StreamPolicy), a
// replay (each replay mode builds its own) or consumer.Process (the zero
// value). A source builds its policy once and hands it to every batch; each
// field says where the engine reads it.
type Policy struct {
	// Scope is the inbox scope; Config.Name when empty (attempt.go: claim;
	// records.go).
	Scope string
	// Inbox is how a batch uses the inbox (attempt.go: begin, claim,
	// commit; handlers.go: runHandlers).
	Inbox InboxUse
	// Select, when set, picks the messages a batch processes; the others
	// are Skipped, untouched (a repair; attempt.go: decideFixed).
	Select func(*Item) bool
	// InOrder processes in order: once a message is to be retried, the
	// messages after it are Held and nothing after it commits; a split batch
	// whose first half does not settle does not run its second half (an
	// ordered source; handlers.go, run.go: split). RunOrdered sets it.
	InOrder bool
	// RetryQueue keeps failed attempts and original routes in the attempts
	// table, for a queue whose failed messages wait in a retry queue
	// (attempt.go: claim; records.go; run.go: giveUp).
	RetryQueue bool
	// Postpone lets a message whose first write names a row another batch
	// in flight wrote leave its batch (Postponed) instead of waiting for
	// that batch's locks. Not for ordered sources or ordering keys: the
	// message then runs after later ones (handlers.go: runOne).
	Postpone bool
	// AsyncCommit commits with synchronous_commit off (a rebuild's batches;
	// attempt.go: beginSQL).
	AsyncCommit bool
	// Gate, when non-zero, is an advisory lock the transaction takes in
	// shared mode as it begins, in the BEGIN round trip (waiting at most
	// HandlerTimeout). A session that takes it exclusively — a rebuild
	// swapping its tables in — waits for the batches in flight and holds
	// the next ones at their start, before they touch anything (attempt.go:
	// beginSQL).
	Gate int64
	// MessageContext decorates each message's handler context; a batch
	// with it runs message by message, never through the batch handler
	// (attempt.go: newBatch).
	MessageContext func(context.Context, *Item) context.Context
	// BeforeCommit runs last inside the transaction, with the results
	// (attempt.go: commit).
	BeforeCommit func(ctx context.Context, tx pgx.Tx, items []*Item, results []Result) error
	// Committed runs after a commit succeeded (attempt.go: commit).
	Committed func(items []*Item, results []Result)
	// AfterCommit runs once a commit returned (tests simulate a crash here;
	// attempt.go: commit).
	AfterCommit func()
	// Abandon, when closed, stops the retries of a failing batch (its
	// broker session died: its messages are redelivered anyway; run.go).
	Abandon <-chan struct{}
}

// InboxUse is how a batch uses the inbox.
type InboxUse uint8

const (
	// Claim claims each message, runs the handlers of the new ones and
	// commits: live consumption and most replays.
	Claim InboxUse = iota
	// Look runs a READ ONLY transaction that is always rolled back: the
	// inbox is looked up, not claimed, and every valid message's handler
	// runs (a forensic replay).
	Look
	// Rerun claims, and runs again the selected messages the inbox already
	// holds (a repair).
	Rerun
)

// QueuePolicy is a queue's policy: failed messages wait in a retry queue,
// with their attempts counted in the attempts table; without an ordering
// key (ordered false) a message whose row another batch writes is
// postponed. A batch's retries stop when abandon closes (its broker session
// died); afterCommit, when set (tests), runs after each commit.
func QueuePolicy(ordered bool, abandon <-chan struct{}, afterCommit func()) Policy {
	return Policy{RetryQueue: true, Postpone: !ordered, Abandon: abandon, AfterCommit: afterCommit}
}

// StreamPolicy is a live stream reader's policy: its batches run in order
// (RunOrdered) and each takes the stream's swap gate.
func StreamPolicy(gate int64) Policy { return Policy{InOrder: true, Gate: gate} }

// scope is the inbox scope of batches with p.
func (p *Policy) scope(e *Engine) string {
	if p.Scope != "" {
		return p.Scope
	}
	return e.cfg.Name
}

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
