package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem"
)

// Status is where an effect stands.
type Status string

// The statuses of an effect.
const (
	// StatusPending is a recorded effect waiting for its first attempt.
	StatusPending Status = "pending"
	// StatusInFlight is an effect claimed by a dispatcher, under a lease.
	StatusInFlight Status = "in_flight"
	// StatusSucceeded is an effect the target confirmed.
	StatusSucceeded Status = "succeeded"
	// StatusFailedRetryable is an effect whose last attempt provably did not
	// take effect (or, for a target that deduplicates by key, whose outcome
	// is unknown while attempts remain); it is retried after next_attempt_at
	// with the same idempotency key.
	StatusFailedRetryable Status = "failed_retryable"
	// StatusFailedTerminal is an effect the target refused for good, or one
	// that ran out of attempts none of which may have taken effect.
	StatusFailedTerminal Status = "failed_terminal"
	// StatusUnknown is an effect that may or may not have taken effect: an
	// answer that proves nothing (a timeout after the request left, a 5xx, a
	// cut response), a lease that expired while in flight, or retries that
	// ran out after such an attempt. It waits for a reconciler or an
	// operator.
	StatusUnknown Status = "unknown"
	// StatusSuppressed is an effect recorded during a rebuild replay, or
	// recorded again under the id of a settled effect retention removed (its
	// tombstone): it is kept for the record and never dispatched.
	StatusSuppressed Status = "suppressed"
)

// statuses is every status in lifecycle order.
var statuses = [...]Status{
	StatusPending, StatusInFlight, StatusSucceeded, StatusFailedRetryable,
	StatusFailedTerminal, StatusUnknown, StatusSuppressed,
}

// Statuses returns every status in lifecycle order, in a new slice the
// caller may change.
func Statuses() []Status { return slices.Clone(statuses[:]) }

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool { return slices.Contains(statuses[:], s) }

// Effect is an external effect a handler wants to happen once.
type Effect struct {
	// Type names the kind of effect, e.g. "payment.capture"; the dispatcher
	// picks the executor by Type. Required.
	Type string
	// BusinessKey identifies the effect in the business domain, e.g. the
	// order id. Together with Type it makes the effect id. Required.
	BusinessKey string
	// Target is where the executor sends the effect: a URL for HTTPExecutor;
	// free text shown to operators for AMQPExecutor.
	Target string
	// Request is the payload the executor sends. json.RawMessage and []byte
	// are stored as they are; any other value is encoded with encoding/json.
	Request any
	// ID overrides the effect id. Default: derived from Type and BusinessKey
	// (see EffectID).
	ID string
	// Consumer and MessageID record which message caused the effect.
	// Optional; shown to operators.
	Consumer, MessageID string
}

// Entry is an effect as the ledger holds it.
type Entry struct {
	// ID is the effect id (the primary key).
	ID string
	// Type, BusinessKey, Target, Consumer and MessageID are as recorded.
	Type, BusinessKey, Target, Consumer, MessageID string
	// IdempotencyKey is sent with every attempt; it never changes.
	IdempotencyKey string
	// RequestHash is the SHA-256 of Request.
	RequestHash idem.Hash
	// Request is the payload the executor sends.
	Request []byte
	// Status is where the effect stands.
	Status Status
	// AttemptCount is the number of attempts claimed so far.
	AttemptCount int
	// NextAttemptAt is when a pending or retryable effect is due.
	NextAttemptAt time.Time
	// LockedUntil is when the current lease ends; zero when not leased.
	LockedUntil time.Time
	// LockOwner is the token of the claim holding the lease.
	LockOwner string
	// LastError describes the last failure, or an operator's resolution.
	LastError string
	// ResponseHash is the SHA-256 of the whole response; zero when none.
	ResponseHash idem.Hash
	// Response is the start of the response, at most MaxResponse bytes.
	Response []byte
	// CreatedAt is when the effect was recorded.
	CreatedAt time.Time
	// CompletedAt is when the effect succeeded or failed for good; zero
	// otherwise.
	CompletedAt time.Time
	// MaybeSent says an attempt may have taken effect: its answer proved
	// nothing (a timeout, a 5xx, a cut response, a lease that ended in
	// flight) or the target said the request was still in progress. Retries
	// that run out then leave the effect unknown, never failed_terminal. An
	// operator's resolution to pending clears it.
	MaybeSent bool
	// TraceContext is the W3C trace context ("traceparent", "tracestate")
	// of the span that recorded the effect; the dispatcher's span for each
	// attempt is its child. Nil when Record's context carried no span.
	TraceContext map[string]string
}

// MaxResponse is how many bytes of a response the ledger keeps. The hash
// covers the whole response.
const MaxResponse = 4096

// EffectID returns the default effect id for an effect of type typ with the
// business key key: 32 hex digits of SHA-256 over both. The same effect gets
// the same id in every process, retry and replay.
func EffectID(typ, key string) string {
	// NUL cannot occur in PostgreSQL text, so it separates unambiguously.
	sum := sha256.Sum256([]byte("idem.ledger.effect\x00" + typ + "\x00" + key))
	return hex.EncodeToString(sum[:16])
}

// IdempotencyKey returns the idempotency key sent with every attempt of the
// effect with id effectID: 32 hex digits of SHA-256 over the id, safe in any
// header whatever the id holds.
func IdempotencyKey(effectID string) string {
	sum := sha256.Sum256([]byte("idem.ledger.key\x00" + effectID))
	return hex.EncodeToString(sum[:16])
}

// Errors returned by the ledger. Wrapped errors match them with errors.Is.
var (
	// ErrEffectConflict means an effect id was recorded before with a
	// different request. The error is an *EffectConflictError.
	ErrEffectConflict = errors.New("ledger: effect recorded before with a different request")
	// ErrNotFound means no effect has the given id.
	ErrNotFound = errors.New("ledger: effect not found")
	// ErrNoCapture means Record ran in forensic mode on a context without
	// WithCapture: forensic replays must not write, so there is nowhere to
	// put the effect.
	ErrNoCapture = errors.New("ledger: forensic mode needs a capture (ledger.WithCapture) and never writes")
	// ErrInFlight means an operator tried to resolve an effect while a
	// dispatcher holds it; wait for the outcome or the lease to expire.
	ErrInFlight = errors.New("ledger: effect is in flight")
	// ErrNotResolvable means an operator tried to resolve a succeeded or
	// suppressed effect.
	ErrNotResolvable = errors.New("ledger: effect cannot be resolved")
)

// EffectConflictError is returned when an effect id is recorded again with a
// different request hash. It matches ErrEffectConflict.
type EffectConflictError struct {
	// EffectID is the contested id.
	EffectID string
	// Stored is the hash of the request already in the ledger.
	Stored idem.Hash
	// Recorded is the hash of the request that was refused.
	Recorded idem.Hash
}

func (e *EffectConflictError) Error() string {
	return fmt.Sprintf("ledger: effect %s recorded before with request %s, refusing request %s",
		e.EffectID, e.Stored.Short(), e.Recorded.Short())
}

// Is makes errors.Is(err, ErrEffectConflict) true.
func (e *EffectConflictError) Is(target error) bool { return target == ErrEffectConflict }
