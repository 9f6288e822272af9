package engine

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// Item is one message as the engine sees it: its identity in the inbox and
// what a dead-letter row needs. A source builds it; the engine never looks
// inside Msg, the source's own message, which it hands to the handler.
type Item struct {
	// ID is the inbox id. For a rejected message it is what the dead-letter
	// row is found by (the cleaned id, or "sha256:" and the payload hash).
	ID string
	// Hash is the payload hash.
	Hash idem.Hash
	// BusinessKey is the optional business key stored in the inbox.
	BusinessKey string
	// Source is the queue or stream.
	Source string
	// Offset is the stream offset when HasOffset.
	Offset    int64
	HasOffset bool
	// Exchange and RoutingKey are the route the message was published
	// with; the engine restores them from the attempts table for messages
	// back from the retry queue.
	Exchange, RoutingKey string
	// Headers are the message headers (trace context, span attributes).
	Headers map[string]any
	// ConversationID is the correlation id, for spans.
	ConversationID string
	// DeliveryTag is the AMQP delivery tag, for spans (0 for streams).
	DeliveryTag uint64
	// Body is the payload (dead-letter rows keep it with StorePayloads).
	Body []byte
	// Attempt is 1 for a first attempt; the engine raises it from the
	// attempts table for messages back from the retry queue.
	Attempt int
	// Suspect marks a delivery the broker made before (redelivered): it may
	// have killed its worker, so it runs alone (see RunAlone).
	Suspect bool
	// Returned marks a delivery back from the consumer's own retry queue:
	// its failed attempts are in the attempts table.
	Returned bool
	// Reject, when set, dead-letters the message without running the handler.
	Reject *Reject
	// Msg is the source's message, handed to the handler.
	Msg any

	// row is the item's attempts-table row, once read.
	row *attemptRow
	// postponed counts the batches the item left because another batch in
	// flight wrote its row (see writeKeys).
	postponed int
}

// Reject says why a message cannot be processed.
type Reject struct {
	// Reason is the dead-letter reason.
	Reason string
	// Err is the cause.
	Err error
}

// Outcome is what became of one message in a batch.
type Outcome uint8

// The outcomes. The zero value means "not decided yet".
const (
	// Processed: the handler ran and its writes committed with the inbox row.
	Processed Outcome = iota + 1
	// Duplicate: the inbox held the id with the same hash.
	Duplicate
	// DeadLettered: a dead-letter row committed; the message goes to the DLQ.
	DeadLettered
	// Retry: the handler failed; nothing committed for it; try again later.
	Retry
	// Unresolved: the batch transaction failed; hand the message back.
	Unresolved
	// Skipped: not selected (Options.Only); nothing was done.
	Skipped
	// Deferred: not attempted because an earlier message of an ordered
	// batch is retried; it runs again after that one.
	Deferred
	// Postponed: it left its batch before writing anything, because another
	// batch in flight writes its row; the source runs it in a later batch.
	Postponed
)

// String is the outcome's metric and log name.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case DeadLettered:
		return "dead_lettered"
	case Retry:
		return "retried"
	case Unresolved:
		return "unresolved"
	case Skipped:
		return "skipped"
	case Deferred:
		return "deferred"
	case Postponed:
		return "postponed"
	default:
		return "undecided"
	}
}

// Final reports whether o settles its message for good.
func (o Outcome) Final() bool {
	return o == Processed || o == Duplicate || o == DeadLettered || o == Skipped
}

// Result is the outcome of one message plus what its source needs to act on it.
type Result struct {
	Outcome Outcome
	// Reason is the dead-letter reason.
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
	// StoredHash is the inbox's hash, for duplicates and conflicts.
	StoredHash idem.Hash
	// Inbox is what the inbox held before the message (0: not looked up).
	Inbox inbox.Decision
}

// unresolved returns n Unresolved results: nothing of the batch committed,
// not even the results decided for messages excluded from it (their
// dead-letter rows and attempt counts are written with the batch).
func unresolved(n int, err error) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = Result{Outcome: Unresolved, Err: err}
	}
	return out
}
