package ledger

import (
	"context"
	"time"
)

// Executor carries out effects of one type. The dispatcher calls Execute
// outside any transaction, with a context whose deadline ends before the
// claim's lease does.
type Executor interface {
	// Execute performs call and says what happened in Result.Status:
	// StatusSucceeded, StatusFailedRetryable (the request provably did not
	// take effect; try again), StatusFailedTerminal (the target refused it
	// for good) or StatusUnknown (the request may have taken effect: report
	// this for any answer that does not prove otherwise). Any other
	// status, the zero Result included, counts as StatusUnknown, the only
	// safe assumption. A non-nil error describes the failure and is kept as
	// the entry's last error.
	Execute(ctx context.Context, call Call) (Result, error)
	// DeduplicatesByKey reports whether the target performs a request at
	// most once per idempotency key. Only then does the dispatcher retry an
	// unknown outcome by itself, with the same key.
	DeduplicatesByKey() bool
}

// Reconciler is implemented by executors that can ask their target what
// became of a request, by idempotency key. The dispatcher calls Lookup for
// unknown effects; without a Reconciler they wait for an operator.
type Reconciler interface {
	// Lookup returns the outcome of the request sent for call. Its Result
	// means what Execute's does: StatusSucceeded or StatusFailedTerminal
	// settle the effect, StatusFailedRetryable says the request never took
	// effect and may be sent again, StatusUnknown (or an error) leaves the
	// effect unknown until the next lookup.
	Lookup(ctx context.Context, call Call) (Result, error)
}

// Call is one attempt at an effect, as an executor sees it.
type Call struct {
	// EffectID is the effect's id.
	EffectID string
	// Type, BusinessKey and Target are as recorded.
	Type, BusinessKey, Target string
	// IdempotencyKey is the same for every attempt of the effect.
	IdempotencyKey string
	// Request is the recorded payload.
	Request []byte
	// Attempt counts the attempts, starting at 1.
	Attempt int
	// RecordedAt is when the effect was recorded: the same on every
	// attempt.
	RecordedAt time.Time
}

// Result is what an executor reports about a call.
type Result struct {
	// Status is the outcome; see Executor.Execute.
	Status Status
	// Response is the target's answer. The ledger keeps its hash and its
	// first MaxResponse bytes.
	Response []byte
	// RetryAfter, for StatusFailedRetryable, is the earliest time to try
	// again that the target asked for; the dispatcher waits at least this
	// long, or its own backoff if that is longer.
	RetryAfter time.Duration
	// InProgress, with StatusUnknown, says the target holds an earlier
	// request under this idempotency key that has not finished (a 409 "in
	// progress"). Such a target deduplicates by key, so the dispatcher sends
	// the request again with the same key after RetryAfter (or its backoff,
	// if longer) while attempts remain, whatever DeduplicatesByKey says;
	// when they run out the effect stays unknown.
	InProgress bool
}
