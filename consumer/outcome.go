package consumer

import (
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
)

// Incoming is a message handed to Process by a source other than the
// built-in queue consumer: a test, a custom transport.
type Incoming struct {
	// MessageID is the id property (what the default MessageID uses).
	MessageID string
	// Body is the payload.
	Body []byte
	// Headers are the message headers.
	Headers map[string]any
	// ContentType is the content type.
	ContentType string
	// CorrelationID is the correlation id.
	CorrelationID string
	// Exchange is where the message was published.
	Exchange string
	// RoutingKey is the key it was published with.
	RoutingKey string
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// DeliveryCount is the broker's delivery count (x-delivery-count).
	DeliveryCount int64
	// Attempt is the processing attempt, 1 when zero.
	Attempt int
	// Source is the queue or stream name; Config.Queue when empty.
	Source string
	// Offset is the stream offset when HasOffset.
	Offset int64
	// HasOffset reports whether Offset is set.
	HasOffset bool
	// Timestamp is the publisher's timestamp.
	Timestamp time.Time
	// ReceivedAt is when the source received the message; the time Process
	// was called when zero.
	ReceivedAt time.Time
}

// Result is what became of a message.
type Result int

// The results Process reports.
const (
	// Processed: the handler ran and its writes committed with the inbox row.
	Processed Result = iota + 1
	// Duplicate: the inbox held the id with the same payload hash; the
	// handler did not run.
	Duplicate
	// DeadLettered: the message cannot be processed; its row in the
	// dead-letter table committed (Outcome.Reason says why).
	DeadLettered
	// Retried: the handler failed; nothing committed for the message. The
	// queue consumer tries it again later; Process leaves that to its caller.
	Retried
	// Unresolved: the batch transaction failed; nothing committed.
	Unresolved
)

// String is the result's name: processed, duplicate, dead_lettered,
// retried or unresolved.
func (r Result) String() string {
	switch r {
	case Processed:
		return engine.Processed.String()
	case Duplicate:
		return engine.Duplicate.String()
	case DeadLettered:
		return engine.DeadLettered.String()
	case Retried:
		return engine.Retry.String()
	default:
		return engine.Unresolved.String()
	}
}

// Outcome says what became of one message passed to Process.
type Outcome struct {
	// MessageID is the id the inbox used (empty when the message had none).
	MessageID string
	// Offset is the stream offset when HasOffset.
	Offset int64
	// HasOffset reports whether the message came from a stream.
	HasOffset bool
	// Hash is the payload hash.
	Hash idem.Hash
	// BusinessKey is the message's business key, when Config.BusinessKey is set.
	BusinessKey string
	// Result is what became of the message.
	Result Result
	// Inbox is what the inbox held before the message: inbox.NewMessage,
	// inbox.Duplicate or inbox.Conflict; 0 when it was never looked up.
	Inbox inbox.Decision
	// StoredHash is the hash the inbox holds, for duplicates and conflicts.
	StoredHash idem.Hash
	// Reason is the dead-letter reason, for DeadLettered.
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
}

// outcomes turns the engine's results into Outcomes.
func outcomes(items []*engine.Item, results []engine.Result) []Outcome {
	out := make([]Outcome, len(results))
	for i, r := range results {
		m := items[i].Msg.(*Message)
		o := Outcome{MessageID: m.ID, Offset: m.Offset, HasOffset: m.HasOffset, Hash: m.Hash, BusinessKey: m.BusinessKey,
			Inbox: r.Inbox, Reason: r.Reason, Err: r.Err}
		switch r.Outcome {
		case engine.Processed:
			o.Result = Processed
		case engine.Duplicate:
			o.Result = Duplicate
		case engine.DeadLettered:
			o.Result = DeadLettered
		case engine.Retry:
			o.Result = Retried
		default:
			o.Result = Unresolved
		}
		switch r.Inbox {
		case inbox.Duplicate:
			o.StoredHash = m.Hash
		case inbox.Conflict:
			o.StoredHash = r.StoredHash
		}
		out[i] = o
	}
	return out
}
