// Package engine is idem's one batch pipeline. A source (the AMQP queue, a
// stream, a replay, consumer.Process) hands it messages; the engine derives
// their identity, runs a batch of them in one PostgreSQL transaction — claim
// every id in the inbox with one statement, run the handler of each new
// message (back to back, or in a savepoint each), flush deferred writes,
// write dead-letter rows and attempt counts, commit — and reports each
// message's Result. The source then acks, checkpoints or retries, and counts.
//
// Around that transaction the engine holds every policy the sources share:
// the fallbacks (a duplicate met by a plain INSERT claim, a handler error in
// a batch without savepoints), the retry of a failed transaction (split in
// halves, cheap conflicts through a short lock_timeout), the handler
// deadline and the abandonment of a handler that ignores it, the isolation
// of suspected poison messages, the admission of concurrent batches, and the
// one ordered loop that streams and replays use. What differs from source to
// source is its policy, one type per source: Queue for Run and RunAlone,
// Ordered for RunOrdered (a stream reader, each replay mode), none for
// RunWithoutRetries (consumer.Process). policy.go turns each into the rules
// a batch reads.
//
// # The path of a message
//
// A new message from a queue, on its way to success, runs in eight files
// of the runtime, from the moment its delivery is on the channel until it
// is acked and counted, none entered by a call more than twice (make path
// measures it):
//
//  1. consumer/source.go: the session's router takes each
//     delivery off the channel (burst).
//  2. consumer/window.go: take puts the delivery in the
//     session's window of unsettled deliveries: the acker will ack it, the
//     gate counts its bytes. Back in burst, message makes it its
//     idem.Message.
//  3. internal/engine/engine.go: PrepareAll derives each message's identity
//     (derive: hash, id, business key) or its rejection, and wraps it in an
//     Item. Back in source.go, route hands it to a worker (by ordering key),
//     the worker collects a batch and runBatch calls Engine.Run with the
//     queue's policy.
//  4. internal/engine/run.go: Run turns the policy into the batch's rules
//     (policy.go: Queue.rules, the one call into that file), admits the
//     batch (the governor), runs it once (once, the cheapest way that
//     works) on a goroutine of its own under a supervisor (supervised), and
//     retries or splits a batch whose transaction fails.
//  5. internal/engine/attempt.go: attempt is the transaction: newBatch,
//     begin (beginSQL: lock bounds, the batch lock), decideFixed, claim.
//  6. inbox/claim.go: ClaimNewBatch checks the claims and inserts them with
//     one statement. Back in attempt.go, claim hands the decisions on.
//  7. internal/engine/handlers.go: runHandlers runs each new message's
//     handler under its deadline (runOne, call, handle), through the
//     guarded transaction (handlerTx), and decides its result. Back in
//     attempt.go, commit flushes what the handlers deferred, writes the
//     records a failure leaves (hasRecords) and commits; end closes the
//     spans and releases the rows the batch wrote and the connection.
//     Back in run.go, supervised and the governor let the batch go.
//  8. consumer/window.go again: back in source.go, runBatch
//     calls settle, which acks the batch (one multiple ack when it can) and
//     gives its bytes back; engine.go again: Count adds the results to the
//     counters and metrics.
//
// Besides these, the path calls value methods of package idem (HashBytes,
// Outcome.Final and Copied, the Deferred writes), internal/sqltext (the
// guard reads each handler statement's first word) and internal/amqpconn
// (the ack's write deadline, and the session's gate, through which the AMQP
// client's reader read the delivery off the socket).
//
// A handler that defers its writes (consumer.Defer) adds the flush of
// package idem's Deferred; a duplicate takes the claim's second statement
// (ClaimBatch); a failure goes through records.go (dead-letter rows,
// attempt counts) and consumer/copies.go (the retry or dead-letter
// copy). A stream or a replay enters run.go through RunOrdered
// (ordered.go). A partitioned queue (consumer/partitioned.go) runs step
// 1 once per partition its process holds, each a queueSource of its own.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/safetext"
)

// Config configures an Engine. Every field is required unless its comment
// gives a default.
type Config struct {
	// Name is the default inbox scope.
	Name string
	// Source is a message's source when it names none: the queue or stream.
	Source string
	// Pool is the PostgreSQL pool.
	Pool *pgxpool.Pool
	// Tables says where idem's tables are.
	Tables idem.Tables
	// Logger receives the engine's logs.
	Logger *slog.Logger
	// MeterProvider and TracerProvider provide the instruments; nil means
	// the global ones.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// Handler runs one message inside the batch transaction.
	Handler func(ctx context.Context, tx pgx.Tx, m *idem.Message) error
	// BatchHandler, when set, runs all of a batch's new messages at once.
	BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*idem.Message) error
	// Hash computes a message's payload hash. Default: the SHA-256 of the
	// body (idem.HashBytes).
	Hash func(body []byte) (idem.Hash, error)
	// MessageID derives a message's identity. Default: its message-id
	// property.
	MessageID func(m *idem.Message) (string, error)
	// BusinessKey, when set, derives a message's business key.
	BusinessKey func(m *idem.Message) (string, error)
	// MaxMessageBytes, MaxHeaders and MaxIDBytes bound a message; beyond
	// them it is dead-lettered without running.
	MaxMessageBytes, MaxHeaders, MaxIDBytes int
	// BatchRetries is how many times a failed transaction is retried.
	BatchRetries int
	// MaxAttempts is how many times a message is tried before it is
	// dead-lettered.
	MaxAttempts int
	// MaxCrashes is how many times a message may be running alone when its
	// worker dies before it is dead-lettered as worker_crashed.
	MaxCrashes int
	// CommitTimeout bounds commit and rollback.
	CommitTimeout time.Duration
	// HandlerTimeout bounds each handler call.
	HandlerTimeout time.Duration
	// LockTimeout is the first lock_timeout of a batch transaction; retries
	// after a lock conflict wait longer.
	LockTimeout time.Duration
	// MaxConcurrency is the most batches admitted at once.
	MaxConcurrency int
	// StorePayloads keeps dead-lettered payloads in their rows.
	StorePayloads bool
}

// Engine runs batches. It is safe for concurrent use.
type Engine struct {
	cfg   Config
	inbox *inbox.Inbox
	dead  *deadletters.Writer
	tel   *Telemetry
	gov   *governor
	keys  *writeKeys
	sql   statements

	// Counts holds the outcome counters behind consumer.Stats.
	Counts Counters
	// Vitals holds what the consumer's health report reads.
	Vitals Vitals
	// DB probes the database while a source runs (see Started).
	DB *health.Database
	// Lag is a stream consumer's position, for the lag metric and Stats.
	Lag Lag

	// careful counts down the batches that run with savepoints after a
	// handler failed in an optimistic batch.
	careful atomic.Int64
	// classicClaims counts down the batches that claim with ClaimBatch
	// after a batch claimed with ClaimNewBatch met a duplicate.
	classicClaims atomic.Int64
	// major caches the server's major version (0: not read yet).
	major atomic.Int32
	// serialKey is the advisory lock that serializes the consumer's batches
	// across processes while they contend (see governor).
	serialKey int64
}

// New returns an Engine for cfg.
func New(cfg Config) (*Engine, error) {
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	dead, err := deadletters.NewWriter(cfg.Tables)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{cfg: cfg, inbox: ib, dead: dead, gov: newGovernor(cfg.MaxConcurrency), keys: newWriteKeys(),
		sql: newStatements(cfg.Tables), serialKey: pglock.Key("idem/batches/" + cfg.Tables.WithDefaults().Schema + "/" + cfg.Name),
		DB: health.NewDatabase(cfg.Pool, "consumer "+cfg.Name+" database")}
	if e.tel, err = newTelemetry(cfg.Name, cfg.Source, cfg.MeterProvider, cfg.TracerProvider, e.Lag.Value); err != nil {
		return nil, fmt.Errorf("engine: telemetry: %w", err)
	}
	return e, nil
}

// SetBatchHandler sets the handler that runs all of a batch's new messages
// at once. Call it before the engine runs a batch.
func (e *Engine) SetBatchHandler(h func(ctx context.Context, tx pgx.Tx, msgs []*idem.Message) error) {
	e.cfg.BatchHandler = h
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Telemetry returns the engine's instruments, which sources share.
func (e *Engine) Telemetry() *Telemetry { return e.tel }

// prepareChunk is the smallest share of a batch prepared on a goroutine of
// its own.
const prepareChunk = 256

// PrepareAll derives the identity of each message a source received — its
// payload hash, its id, its business key — in place, or why it cannot be
// processed, and wraps it in an Item. A message without a Source gets
// Config.Source; without a ReceivedAt, the time of the call. It counts the
// messages as consumed. A large batch (a stream's, a replay's) is split over
// the CPUs: deriving hashes, ids and business keys (often a JSON decode) is
// the largest part of the runtime's own CPU per message there, and the
// database is idle meanwhile.
func (e *Engine) PrepareAll(msgs []idem.Message) []*Item {
	e.tel.consumed.Add(context.Background(), int64(len(msgs)), e.tel.consumedOpt...)
	now := time.Now()
	out := make([]*Item, len(msgs))
	parts := min(runtime.GOMAXPROCS(0), len(msgs)/prepareChunk)
	if parts <= 1 {
		for i := range msgs {
			out[i] = e.prepare(&msgs[i], now)
		}
		return out
	}
	size := (len(msgs) + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := 0; lo < len(msgs); lo += size {
		hi := min(lo+size, len(msgs))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				out[i] = e.prepare(&msgs[i], now)
			}
		})
	}
	wg.Wait()
	return out
}

// prepare derives m's identity and wraps it in an item.
func (e *Engine) prepare(m *idem.Message, now time.Time) *Item {
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	if m.Source == "" {
		m.Source = e.cfg.Source
	}
	if m.ReceivedAt.IsZero() {
		m.ReceivedAt = now
	}
	m.Attempt = max(m.Attempt, 1)
	it := &Item{Message: m, Reject: e.derive(m)}
	if it.Reject != nil && m.ID == "" && m.MessageID != "" {
		// What the dead-letter row is found by: the id as far as it is text.
		m.ID = safetext.Truncate(safetext.Clean(m.MessageID), 200)
	}
	return it
}

// errMissingID is the cause stored for missing_message_id dead letters.
var errMissingID = errors.New("message has no id")

// derive fills m's hash, id and business key, or says why it cannot be
// processed.
func (e *Engine) derive(m *idem.Message) *Reject {
	reject := func(reason string, err error) *Reject {
		if m.Hash.IsZero() { // rejected before Config.Hash could hash it
			m.Hash = idem.HashBytes(m.Body)
		}
		return &Reject{Reason: reason, Err: err}
	}
	switch {
	case len(m.Body) > e.cfg.MaxMessageBytes:
		e.tel.Limit("message_bytes")
		return reject(deadletters.ReasonTooLarge, fmt.Errorf("body has %d bytes, limit is %d", len(m.Body), e.cfg.MaxMessageBytes))
	case len(m.Headers) > e.cfg.MaxHeaders:
		e.tel.Limit("headers")
		return reject(deadletters.ReasonTooManyHeaders, fmt.Errorf("message has %d headers, limit is %d", len(m.Headers), e.cfg.MaxHeaders))
	}
	if e.cfg.Hash == nil {
		m.Hash = idem.HashBytes(m.Body)
	} else {
		h, err := e.cfg.Hash(m.Body)
		if err != nil {
			return reject(deadletters.ReasonDecodeError, fmt.Errorf("hash payload: %w", err))
		}
		m.Hash = h
	}
	id, err := m.MessageID, error(nil)
	if e.cfg.MessageID != nil {
		id, err = e.cfg.MessageID(m)
	}
	switch {
	case err != nil:
		return reject(deadletters.ReasonInvalidMessageID, err)
	case id == "":
		return reject(deadletters.ReasonMissingMessageID, errMissingID)
	case len(id) > e.cfg.MaxIDBytes:
		e.tel.Limit("id_bytes")
		return reject(deadletters.ReasonInvalidMessageID, fmt.Errorf("message id has %d bytes, limit is %d", len(id), e.cfg.MaxIDBytes))
	case !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0:
		return reject(deadletters.ReasonInvalidMessageID, errors.New("message id is not valid UTF-8 text"))
	}
	m.ID = id
	if e.cfg.BusinessKey != nil {
		key, err := e.cfg.BusinessKey(m)
		if err == nil && (len(key) > e.cfg.MaxIDBytes || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0) {
			err = fmt.Errorf("business key is not valid UTF-8 text of at most %d bytes", e.cfg.MaxIDBytes)
		}
		if err != nil {
			return reject(deadletters.ReasonInvalidKey, err)
		}
		m.BusinessKey = key
	}
	return nil
}

// Counters count what the engine and its sources did.
type Counters struct {
	Processed, Duplicates, Conflicts, DeadLettered, Retried, Unresolved atomic.Int64
	Batches, AcksDropped, Reconnects, Abandoned, Contention, Postponed  atomic.Int64
	// ByOutcome counts the results of every outcome, indexed by
	// idem.Outcome, a payload conflict as a dead letter: an outcome added
	// to idem is counted here, in consumer.Stats and in the metric without
	// more code.
	ByOutcome [idem.MaxOutcome + 1]atomic.Int64
}

// Count adds a batch's results to the counters and metrics: by outcome (a
// payload conflict counts as a dead letter, and as a conflict in the
// metric), inbox decision and dead-letter reason. Sources call it once they
// have acted on the results (the broker was told).
func (e *Engine) Count(ctx context.Context, res []Result) {
	k, t := &e.Counts, e.tel
	counts := map[idem.Outcome]int64{}
	var conflicts int64
	decisions := map[inbox.Decision]int64{}
	for _, r := range res {
		if r.Inbox != 0 {
			decisions[r.Inbox]++
		}
		switch {
		case r.Outcome == idem.DeadLettered && r.Reason == deadletters.ReasonPayloadConflict:
			conflicts++
		default:
			counts[r.Outcome]++
		}
		if r.Outcome == idem.DeadLettered {
			t.deadLetters.Add(ctx, 1, t.with(reasonAttr(r.Reason)))
		}
	}
	k.Processed.Add(counts[idem.Processed])
	k.Duplicates.Add(counts[idem.Duplicate])
	k.Conflicts.Add(conflicts)
	k.DeadLettered.Add(counts[idem.DeadLettered] + conflicts)
	k.Retried.Add(counts[idem.Retried])
	k.Unresolved.Add(counts[idem.Unresolved])
	k.Postponed.Add(counts[idem.Postponed])
	if conflicts > 0 {
		t.messages.Add(ctx, conflicts, t.conflictOpt...)
	}
	for o, n := range counts {
		if opts, ok := t.byOutcome[o]; ok && n > 0 {
			t.messages.Add(ctx, n, opts...)
		}
	}
	counts[idem.DeadLettered] += conflicts
	for o, n := range counts {
		if o <= idem.MaxOutcome && n > 0 {
			k.ByOutcome[o].Add(n)
		}
	}
	for d, n := range decisions {
		if opts, ok := t.byDecision[d]; ok {
			t.decisions.Add(ctx, n, opts...)
		}
	}
}

// Lag is a stream consumer's position: the last committed checkpoint and
// the last sampled tail, for the lag metric and Stats.
type Lag struct {
	Checkpoint, Tail atomic.Int64
}

// Value is the tail minus the checkpoint; ok is false before either is known.
func (l *Lag) Value() (int64, bool) {
	if l.Tail.Load() == 0 && l.Checkpoint.Load() == 0 {
		return 0, false
	}
	return max(l.Tail.Load()-l.Checkpoint.Load(), 0), true
}

// Key is what consumer.Consumer.Engine asks for. Only the module's own
// packages (consumer/stream, replay) can call ModuleKey, so only they can
// reach a consumer's engine: there is no global seam between the packages.
// Another module can only make the zero Key (a generic function's zero
// value), which Check refuses.
type Key struct{ valid bool }

// ModuleKey returns the Key that opens a consumer's engine.
func ModuleKey() Key { return Key{valid: true} }

// Check panics unless k came from ModuleKey: a program outside idem reached
// for an engine it must not drive.
func (k Key) Check() {
	if !k.valid {
		panic("idem: a consumer's engine is for idem's own packages")
	}
}

// SetHandler sets the handler that runs one message. Call it before the
// engine runs a batch.
func (e *Engine) SetHandler(h func(ctx context.Context, tx pgx.Tx, m *idem.Message) error) {
	e.cfg.Handler = h
}

// SetSource names the source the engine's messages come from when the
// consumer that built it was not given one: a stream. Call it before the
// engine runs a batch.
func (e *Engine) SetSource(source string) {
	e.cfg.Source = source
	e.tel.setSource(source)
}
