// Package engine is idem's one batch pipeline. A source (the AMQP queue,
// a stream, a replay, consumer.Process) hands it a batch of prepared items;
// the engine runs them in one PostgreSQL transaction — claim every id in
// the inbox with one statement, run the handler of each new message (back to
// back, or in a savepoint each), flush deferred writes, write dead-letter
// rows and attempt counts, commit — and reports each item's Result. The
// source then acks, checkpoints or retries.
//
// Around that transaction the engine holds every policy the sources share:
// the fallbacks (a duplicate met by a plain INSERT claim, a handler error in
// a batch without savepoints), the retry of a failed transaction (split in
// halves, cheap conflicts through a short lock_timeout), the handler
// deadline and the abandonment of a handler that ignores it, the isolation of
// suspected poison messages, the admission of concurrent batches, and the one
// ordered loop that streams and replays use.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/pglock"
)

// Config configures an Engine. Every field is required unless its comment
// gives a default.
type Config struct {
	// Name is the default inbox scope.
	Name string
	// Pool is the PostgreSQL pool.
	Pool *pgxpool.Pool
	// Tables says where idem's tables are.
	Tables idem.Tables
	// Logger receives the engine's logs.
	Logger *slog.Logger
	// Telemetry holds the instruments.
	Telemetry *Telemetry
	// Handler runs one item inside the batch transaction. It must recover
	// its own panics (into an error).
	Handler func(ctx context.Context, tx pgx.Tx, it *Item) error
	// BatchHandler, when set, runs all of a batch's new items at once. It
	// must recover its own panics.
	BatchHandler func(ctx context.Context, tx pgx.Tx, its []*Item) error
	// DeadLetterReason reports whether a handler error asks for a dead
	// letter (consumer.Permanent, consumer.DeadLetter), and why.
	DeadLetterReason func(err error) (reason string, ok bool)
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
	return &Engine{cfg: cfg, inbox: ib, tel: cfg.Telemetry, gov: newGovernor(cfg.MaxConcurrency), keys: newWriteKeys(),
		sql: newStatements(cfg.Tables), serialKey: pglock.Key("idem/batches/" + cfg.Tables.WithDefaults().Schema + "/" + cfg.Name),
		DB: health.NewDatabase(cfg.Pool, "consumer "+cfg.Name+" database")}, nil
}

// SetBatchHandler sets the handler that runs all of a batch's new items at
// once. Call it before the engine runs a batch.
func (e *Engine) SetBatchHandler(h func(ctx context.Context, tx pgx.Tx, its []*Item) error) {
	e.cfg.BatchHandler = h
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Telemetry returns the engine's instruments, which sources share.
func (e *Engine) Telemetry() *Telemetry { return e.tel }

// Counters count what the engine and its sources did.
type Counters struct {
	Processed, Duplicates, Conflicts, DeadLettered, Retried, Unresolved atomic.Int64
	Batches, AcksDropped, Reconnects, Abandoned, Contention, Postponed  atomic.Int64
}

// count adds one batch's outcomes to the counters.
func (k *Counters) count(results []Result) {
	for _, r := range results {
		switch r.Outcome {
		case Processed:
			k.Processed.Add(1)
		case Duplicate:
			k.Duplicates.Add(1)
		case DeadLettered:
			if r.Reason == deadletters.ReasonPayloadConflict {
				k.Conflicts.Add(1)
			}
			k.DeadLettered.Add(1)
		case Retry:
			k.Retried.Add(1)
		case Unresolved:
			k.Unresolved.Add(1)
		case Postponed:
			k.Postponed.Add(1)
		}
	}
}

// TimeoutError is the error of a handler that ran past HandlerTimeout.
type TimeoutError struct {
	Limit time.Duration
	// Abandoned reports that the handler ignored its context: its
	// transaction was closed under it and its goroutine left behind.
	Abandoned bool
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

func (e *TimeoutError) Error() string {
	if e.Abandoned {
		return fmt.Sprintf("handler ignored its context %s past its %s deadline and was abandoned", abandonGrace, e.Limit)
	}
	return fmt.Sprintf("handler ran past its %s deadline", e.Limit)
}

// classify turns a handler error into a dead letter or a retry.
func (e *Engine) classify(it *Item, herr error) Result {
	if reason, ok := e.cfg.DeadLetterReason(herr); ok {
		return Result{Outcome: DeadLettered, Reason: reason, Err: herr}
	}
	if it.Attempt >= e.cfg.MaxAttempts {
		reason := deadletters.ReasonMaxAttempts
		if _, ok := errors.AsType[*TimeoutError](herr); ok {
			reason = deadletters.ReasonHandlerTimeout
		}
		return Result{Outcome: DeadLettered, Reason: reason,
			Err: fmt.Errorf("attempt %d of %d: %w", it.Attempt, e.cfg.MaxAttempts, herr)}
	}
	return Result{Outcome: Retry, Err: herr}
}
