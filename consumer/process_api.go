package consumer

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// Incoming is a message handed to Process by a source other than the
// built-in queue consumer: a test, a replay, a custom transport.
type Incoming struct {
	// MessageID is the id property (what IDFromProperty returns).
	MessageID string
	// Body is the payload.
	Body []byte
	// Headers are the message headers.
	Headers map[string]any
	// ContentType is the content type.
	ContentType string
	// CorrelationID is the correlation id.
	CorrelationID string
	// Exchange and RoutingKey say where the message was published.
	Exchange, RoutingKey string
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
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
	// Result is "processed", "duplicate", "dead_lettered", "retried",
	// "skipped" (not selected), "deferred" (not attempted: an earlier
	// message is retried, see StopAtRetry) or "unresolved".
	Result string
	// Inbox is what the inbox held before the message: "new" (not
	// processed), "duplicate" (processed with the same hash), "conflict"
	// (another payload under the id), or "" when it was never looked up.
	Inbox string
	// StoredHash is the hash the inbox holds, for "duplicate" and "conflict".
	StoredHash idem.Hash
	// Reason is the dead-letter reason, for "dead_lettered".
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
}

// Process runs msgs as one batch through the same pipeline as Run (payload
// hash, identity, inbox claim, savepoint, handler, dead-letter rows, commit)
// without a broker, and reports each message's outcome. Nothing is
// published: a "retried" message is simply not committed, a "dead_lettered"
// one has its row in the dead-letter table. Process needs no AMQPURL or
// Queue; it is what tests (see package consumertest) and custom sources call.
func (c *Consumer) Process(ctx context.Context, msgs []Incoming) ([]Outcome, error) {
	return c.ProcessWith(ctx, msgs, BatchOptions{})
}

// BatchOptions change how ProcessWith runs a batch. Package replay uses
// them for its modes; the zero value is what Process does.
type BatchOptions struct {
	// Scope is the inbox consumer name the batch claims under. Default:
	// Config.Name. A rebuild replay uses a scope of its own.
	Scope string
	// ReadOnly runs a READ ONLY transaction that is always rolled back: the
	// inbox is looked up instead of claimed, every valid message's handler
	// runs (and fails if it writes), and nothing is recorded.
	ReadOnly bool
	// Only, when set, selects the messages to process; the others are
	// reported "skipped" and not touched.
	Only func(m *Message) bool
	// Rerun runs the handler of (selected) messages the inbox already holds
	// with the same hash, instead of skipping them as duplicates.
	Rerun bool
	// MessageContext, when set, decorates each handler's context (a replay
	// attaches a ledger capture to it, for instance). A batch with
	// MessageContext runs message by message, never through HandleBatch's
	// handler, which has no per-message context.
	MessageContext func(ctx context.Context, m *Message) context.Context
	// StopAtRetry processes the batch in order: once a message's handler
	// fails with a retryable error, the messages after it are not attempted
	// (Result "deferred") and nothing after it commits, so a source that
	// retries in place can keep its checkpoint before the failed message
	// without leaving later messages processed past it.
	StopAtRetry bool
	// AsyncCommit commits with synchronous_commit off: a crash may lose the
	// last batches, never part of one. Only for work that is redone after a
	// crash and has nothing outside the database depend on its commit — a
	// rebuild, whose checkpoint is in the same transaction and whose effects
	// are suppressed. Never for queue consumption, which acks after commit.
	AsyncCommit bool
	// BeforeCommit, when set, runs last inside the batch transaction, after
	// the handlers, with the outcomes so far (checkpoints and audit rows are
	// written here). Not called when ReadOnly.
	BeforeCommit func(ctx context.Context, tx pgx.Tx, outcomes []Outcome) error
}

// ProcessWith is Process with options.
func (c *Consumer) ProcessWith(ctx context.Context, msgs []Incoming, opts BatchOptions) ([]Outcome, error) {
	if c.handler == nil {
		return nil, configError("no handler: call Handle before Process")
	}
	prepared := c.prepareAll(msgs)
	bo := batchOptions{scope: opts.Scope, readOnly: opts.ReadOnly, only: opts.Only, rerun: opts.Rerun,
		messageContext: opts.MessageContext, asyncCommit: opts.AsyncCommit, stopAtRetry: opts.StopAtRetry}
	if opts.BeforeCommit != nil {
		bo.beforeCommit = func(ctx context.Context, tx pgx.Tx, msgs []*Message, results []result) error {
			return opts.BeforeCommit(ctx, tx, outcomes(msgs, results))
		}
	}
	results, err := c.processFallback(ctx, prepared, bo)
	if err != nil {
		return nil, err
	}
	if !opts.ReadOnly {
		c.counts.count(results)
	}
	return outcomes(prepared, results), nil
}

func outcomes(msgs []*Message, results []result) []Outcome {
	out := make([]Outcome, len(results))
	for i, r := range results {
		m := msgs[i]
		o := Outcome{MessageID: m.ID, Offset: m.Offset, HasOffset: m.HasOffset, Hash: m.Hash, BusinessKey: m.BusinessKey,
			Result: r.outcome.String(), Reason: r.reason, Err: r.err}
		if r.inbox != 0 {
			o.Inbox = r.inbox.String()
			switch r.inbox {
			case inbox.Duplicate:
				o.StoredHash = m.Hash
			case inbox.Conflict:
				o.StoredHash = r.storedHash
			}
		}
		out[i] = o
	}
	return out
}

// prepareChunk is the smallest share of a batch prepared on a goroutine of
// its own.
const prepareChunk = 256

// prepareAll turns ins into prepared Messages. A large batch (a stream's,
// a replay's) is split over the CPUs: deriving hashes, ids and business
// keys (often a JSON decode) is the largest part of the runtime's own CPU
// per message there, and the database is idle meanwhile.
func (c *Consumer) prepareAll(ins []Incoming) []*Message {
	out := make([]*Message, len(ins))
	now := time.Now()
	parts := min(runtime.GOMAXPROCS(0), len(ins)/prepareChunk)
	if parts <= 1 {
		for i := range ins {
			out[i] = c.fromIncoming(ins[i], now)
		}
		return out
	}
	size := (len(ins) + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := 0; lo < len(ins); lo += size {
		hi := min(lo+size, len(ins))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				out[i] = c.fromIncoming(ins[i], now)
			}
		})
	}
	wg.Wait()
	return out
}

// fromIncoming turns an Incoming into a prepared Message; now is its
// ReceivedAt unless the Incoming has one.
func (c *Consumer) fromIncoming(in Incoming, now time.Time) *Message {
	m := &Message{
		Body:          in.Body,
		Headers:       in.Headers,
		ContentType:   in.ContentType,
		CorrelationID: in.CorrelationID,
		Exchange:      in.Exchange,
		RoutingKey:    in.RoutingKey,
		Redelivered:   in.Redelivered,
		Attempt:       max(in.Attempt, 1),
		Source:        in.Source,
		Offset:        in.Offset,
		HasOffset:     in.HasOffset,
		Timestamp:     in.Timestamp,
		ReceivedAt:    in.ReceivedAt,
	}
	if m.ReceivedAt.IsZero() {
		m.ReceivedAt = now
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	if m.Source == "" {
		m.Source = c.source
	}
	c.prepare(m, in.MessageID)
	return m
}

// IsBatchError reports whether err from Process means the batch transaction
// failed as a whole (nothing in it is known to have committed; run it again).
func IsBatchError(err error) bool {
	var be *batchError
	return errors.As(err, &be)
}
