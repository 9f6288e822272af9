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
	"github.com/idemkit/idem/internal/canonjson"
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
	if e.tel, err = newTelemetry(cfg.Name, cfg.Source, cfg.MeterProvider, cfg.TracerProvider, e.Lag.Value, &e.Counts); err != nil {
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
	e.Counts.consumed.Add(int64(len(msgs)))
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
	var hashErr error
	if e.cfg.Hash == nil {
		m.Hash = idem.HashBytes(m.Body)
	} else if m.Hash, hashErr = e.cfg.Hash(m.Body); hashErr != nil {
		m.Hash = idem.HashBytes(m.Body)
	}
	id, err := m.MessageID, error(nil)
	if e.cfg.MessageID != nil {
		id, err = e.cfg.MessageID(m)
	}
	if err == nil {
		err = canonjson.CheckID(id) // refused, never repaired, whatever the id's source
	}
	switch {
	case errors.Is(err, idem.ErrInvalidID): // named so even in a body the hash refuses too
		return reject(deadletters.ReasonInvalidID, err)
	case hashErr != nil:
		return reject(deadletters.ReasonDecodeError, fmt.Errorf("hash payload: %w", hashErr))
	case err != nil:
		return reject(deadletters.ReasonInvalidMessageID, err)
	case id == "":
		return reject(deadletters.ReasonMissingMessageID, errMissingID)
	case len(id) > e.cfg.MaxIDBytes:
		e.tel.Limit("id_bytes")
		return reject(deadletters.ReasonInvalidMessageID, fmt.Errorf("message id has %d bytes, limit is %d", len(id), e.cfg.MaxIDBytes))
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

// Counters count what the engine and its sources did. The metrics of
// messages received, by outcome, by inbox decision and by dead-letter
// reason observe them (see Telemetry): Stats and the metrics read one count.
type Counters struct {
	// Conflicts counts the payload conflicts, which ByOutcome counts as
	// dead letters.
	Conflicts                                               atomic.Int64
	Batches, AcksDropped, Reconnects, Abandoned, Contention atomic.Int64
	// OrderGaps counts the dead letters of a queue with an ordering key:
	// their key's later messages were applied without them.
	OrderGaps atomic.Int64
	// ByOutcome counts the results of every outcome, indexed by
	// idem.Outcome, a payload conflict as a dead letter: an outcome added
	// to idem is counted here, in consumer.Stats and in the metric without
	// more code.
	ByOutcome [idem.MaxOutcome + 1]atomic.Int64

	// consumed counts the messages received (PrepareAll); outcomes the
	// results by outcome as the metric counts them, a payload conflict apart
	// (in Conflicts); decisions the inbox's decisions; reasons the dead
	// letters by reason (string to *atomic.Int64).
	consumed  atomic.Int64
	outcomes  [idem.MaxOutcome + 1]atomic.Int64
	decisions [inbox.Conflict + 1]atomic.Int64
	reasons   sync.Map
}

// Count adds a batch's results to the counters, which the metrics observe:
// by outcome (a payload conflict counts as a dead letter, and as a conflict
// in the metric), inbox decision and dead-letter reason. Sources call it
// once they have acted on the results (the broker was told).
func (e *Engine) Count(_ context.Context, res []Result) { e.Counts.add(res) }

// add counts res (see Count).
func (k *Counters) add(res []Result) {
	var counts [idem.MaxOutcome + 1]int64
	var conflicts int64
	for _, r := range res {
		if r.Inbox > 0 && int(r.Inbox) < len(k.decisions) {
			k.decisions[r.Inbox].Add(1)
		}
		switch {
		case r.Outcome == idem.DeadLettered && r.Reason == deadletters.ReasonPayloadConflict:
			conflicts++
		case r.Outcome <= idem.MaxOutcome:
			counts[r.Outcome]++
		}
		if r.Outcome == idem.DeadLettered {
			k.reason(r.Reason).Add(1)
		}
	}
	k.Conflicts.Add(conflicts)
	for o, n := range counts {
		if n > 0 {
			k.outcomes[o].Add(n)
		}
	}
	counts[idem.DeadLettered] += conflicts
	for o, n := range counts {
		if n > 0 {
			k.ByOutcome[o].Add(n)
		}
	}
}

// reason is the counter of the dead letters with reason.
func (k *Counters) reason(reason string) *atomic.Int64 {
	if n, ok := k.reasons.Load(reason); ok {
		return n.(*atomic.Int64)
	}
	n, _ := k.reasons.LoadOrStore(reason, new(atomic.Int64))
	return n.(*atomic.Int64)
}

// counted is what the metrics observe of the counters (see Telemetry).
type counted struct {
	consumed, conflicts int64
	outcomes            [idem.MaxOutcome + 1]int64
	decisions           [inbox.Conflict + 1]int64
	reasons             map[string]int64
}

// counted reads the counters the metrics observe.
func (k *Counters) counted() counted {
	c := counted{consumed: k.consumed.Load(), conflicts: k.Conflicts.Load(), reasons: map[string]int64{}}
	for o := range c.outcomes {
		c.outcomes[o] = k.outcomes[o].Load()
	}
	for d := range c.decisions {
		c.decisions[d] = k.decisions[d].Load()
	}
	k.reasons.Range(func(r, n any) bool {
		c.reasons[r.(string)] = n.(*atomic.Int64).Load()
		return true
	})
	return c
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

// SetHandler sets the handler that runs one message. Call it before the
// engine runs a batch.
func (e *Engine) SetHandler(h func(ctx context.Context, tx pgx.Tx, m *idem.Message) error) {
	e.cfg.Handler = h
}
