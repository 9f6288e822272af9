package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/replay"
)

// Count is what a cleanup kept and deleted in one table.
type Count struct {
	// Table is the table's name without schema and prefix: "inbox",
	// "ledger", "ledger_audit", "ledger_tombstones", "dead_letters",
	// "replay_runs", "replay_audit", "checkpoints", "attempts" or
	// "http_keys".
	Table string
	// Cutoff is the point in time, by the database clock, before which the
	// table's rows were deleted: the table keeps what is younger. Zero when
	// age does not decide: http_keys go at their own expiry, and
	// ledger_tombstones are kept for good unless
	// Config.TombstonesOlderThan is set.
	Cutoff time.Time
	// Deleted is how many rows were deleted.
	Deleted int64
	// Partitions is how many whole partitions were dropped, for an inbox
	// laid out in time partitions; Deleted counts the rows they held.
	Partitions int
}

// Result says what Clean deleted.
type Result struct {
	// Cutoff is the point in time, by the database clock, before which
	// rows were deleted from the tables that keep Config.OlderThan; each
	// Count has its table's own.
	Cutoff time.Time
	// Counts holds one entry per table, in the order Clean cleans them.
	Counts []Count
}

// Deleted returns how many rows were deleted from table (a Count.Table
// name).
func (r Result) Deleted(table string) int64 {
	for _, c := range r.Counts {
		if c.Table == table {
			return c.Deleted
		}
	}
	return 0
}

// Total returns how many rows were deleted from all tables.
func (r Result) Total() int64 {
	var n int64
	for _, c := range r.Counts {
		n += c.Deleted
	}
	return n
}

func (r *Result) add(table string, n int64) {
	for i := range r.Counts {
		if r.Counts[i].Table == table {
			r.Counts[i].Deleted += n
			return
		}
	}
	r.Counts = append(r.Counts, Count{Table: table, Deleted: n})
}

// keep declares table with its cutoff, before anything is deleted from it.
func (r *Result) keep(table string, cutoff time.Time) {
	r.Counts = append(r.Counts, Count{Table: table, Cutoff: cutoff})
}

// cutoffs are the points in time Clean deletes before, fixed when it
// starts.
type cutoffs struct {
	rows, ledger, tombstones time.Time // tombstones: zero when kept
}

// cutoffSQL computes the cutoffs from microseconds; a tombstone age of 0
// keeps them (NULL).
const cutoffSQL = `SELECT now() - $1::bigint * interval '1 microsecond', now() - $2::bigint * interval '1 microsecond',
	now() - nullif($3::bigint, 0) * interval '1 microsecond'`

// Clean deletes what idem no longer needs, table by table, in chunks of
// cfg.ChunkSize rows, each chunk one statement in its own transaction:
//
//   - inbox: rows whose message was last seen before the cutoff
//     (inbox.Inbox.Cleanup, which records what each consumer forgot, see
//     inbox.Horizon, and never touches a held scope such as a running
//     online rebuild's);
//   - ledger and ledger_audit: effects settled before the ledger's cutoff
//     (now() - cfg.LedgerOlderThan), succeeded, suppressed, and
//     failed_terminal once an operator resolved them so, with their audit
//     rows. Pending, in-flight, retryable, unknown and unresolved
//     failed_terminal effects are never deleted. Each deleted effect leaves
//     a tombstone in ledger_tombstones, in the same statement, so that an
//     effect recorded again under its id is suppressed, never sent (see
//     ledger.DeleteSettled);
//   - ledger_tombstones: kept, unless cfg.TombstonesOlderThan is set: then
//     tombstones whose effect was deleted before now() - it;
//   - dead_letters: rows dead-lettered before the cutoff;
//   - replay_runs, replay_audit and checkpoints: runs finished (or
//     abandoned) before the cutoff, with their audit rows and their progress
//     checkpoints. Running (or interrupted, resumable) runs are kept;
//   - attempts: failure counts last updated before the cutoff;
//   - http_keys: HTTP idempotency keys past their own expiry and
//     tombstone (httpinbox.Config.Expiry and Tombstone), whatever the
//     cutoff; an unknown outcome stays until an operator resolves it.
//
// The cutoff is now() - cfg.OlderThan, fixed when Clean starts, as are the
// ledger's and the tombstones'; Result has each table's. Clean refuses an
// age below cfg.Floor with ErrBelowFloor before deleting anything. It
// skips rows that running transactions hold locked and never waits for
// them. On error (or when ctx ends) it returns what it deleted so far with
// the error; the next call goes on from there. A Clean that goes through
// sets the gauge idem.retention.last_success.timestamp.
func Clean(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return Result{}, fmt.Errorf("retention: metrics: %w", err)
	}
	var (
		at         cutoffs
		tombstones *time.Time
	)
	err = cfg.Pool.QueryRow(ctx, cutoffSQL, cfg.OlderThan.Microseconds(), cfg.LedgerOlderThan.Microseconds(),
		cfg.TombstonesOlderThan.Microseconds()).Scan(&at.rows, &at.ledger, &tombstones)
	if err != nil {
		return Result{}, fmt.Errorf("retention: cutoff: %w", err)
	}
	if tombstones != nil {
		at.tombstones = *tombstones
	}
	res := Result{Cutoff: at.rows}
	for _, t := range []func(context.Context, Config, cutoffs, *Result) error{cleanInbox, cleanLedger, cleanTables, cleanHTTPKeys} {
		if err := t(ctx, cfg, at, &res); err != nil {
			return res, err
		}
	}
	m.succeeded(time.Now())
	return res, nil
}

// cleanInbox deletes expired inbox rows through the inbox package, which
// records the consumers' horizons.
func cleanInbox(ctx context.Context, cfg Config, at cutoffs, res *Result) error {
	res.keep("inbox", at.rows)
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables})
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	r, err := ib.Cleanup(ctx, cfg.Pool, inbox.CleanupOptions{
		ChunkSize: cfg.ChunkSize, OlderThan: cfg.OlderThan, Floor: cfg.Floor,
	})
	res.add("inbox", r.Deleted)
	for i := range res.Counts {
		if res.Counts[i].Table == "inbox" {
			res.Counts[i].Partitions += r.Partitions
		}
	}
	if err != nil {
		return fmt.Errorf("retention: inbox: %w", err)
	}
	return nil
}

// cleanLedger deletes the settled effects past the ledger's own cutoff,
// which leaves their tombstones, then the tombstones past theirs, if set.
func cleanLedger(ctx context.Context, cfg Config, at cutoffs, res *Result) error {
	res.keep("ledger", at.ledger)
	res.keep("ledger_audit", at.ledger)
	res.keep("ledger_tombstones", at.tombstones)
	effects, audits, err := ledger.DeleteSettled(ctx, cfg.Pool, cfg.Tables, at.ledger, cfg.ChunkSize)
	res.add("ledger", effects)
	res.add("ledger_audit", audits)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	if at.tombstones.IsZero() {
		return nil
	}
	n, err := ledger.DeleteTombstones(ctx, cfg.Pool, cfg.Tables, at.tombstones, cfg.ChunkSize)
	res.add("ledger_tombstones", n)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	return nil
}

// cleanHTTPKeys deletes expired HTTP idempotency keys through httpinbox.
func cleanHTTPKeys(ctx context.Context, cfg Config, _ cutoffs, res *Result) error {
	res.keep("http_keys", time.Time{})
	n, err := httpinbox.CleanupExpired(ctx, cfg.Pool, cfg.Tables, cfg.ChunkSize)
	res.add("http_keys", int64(n))
	if err != nil {
		return fmt.Errorf("retention: http_keys: %w", err)
	}
	return nil
}

// cleanTables has each of the other tables' owners delete what aged past
// the cutoff, chunk by chunk, in this order: dead-letter rows, finished
// replay runs, attempt counts. Every table idem owns is cleaned here or by
// Clean's other steps, except the live consumers' checkpoints, the inbox
// horizons and the migrations table, which do not grow with traffic; a new
// table that grows with traffic gets a delete function in the package that
// owns it, called from here.
func cleanTables(ctx context.Context, cfg Config, at cutoffs, res *Result) error {
	for _, t := range []string{"dead_letters", "replay_runs", "replay_audit", "checkpoints", "attempts"} {
		res.keep(t, at.rows)
	}
	n, err := deadletters.DeleteBefore(ctx, cfg.Pool, cfg.Tables, at.rows, cfg.ChunkSize)
	res.add("dead_letters", n)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	runs, audits, checkpoints, err := replay.DeleteFinishedRuns(ctx, cfg.Pool, cfg.Tables, at.rows, cfg.ChunkSize)
	res.add("replay_runs", runs)
	res.add("replay_audit", audits)
	res.add("checkpoints", checkpoints)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	n, err = engine.DeleteAttemptsBefore(ctx, cfg.Pool, cfg.Tables, at.rows, cfg.ChunkSize)
	res.add("attempts", n)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	return nil
}
