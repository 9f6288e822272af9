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

// Count is how many rows a cleanup deleted from one table.
type Count struct {
	// Table is the table's name without schema and prefix: "inbox",
	// "ledger", "ledger_audit", "dead_letters", "replay_runs",
	// "replay_audit", "checkpoints", "attempts" or "http_keys".
	Table string
	// Deleted is how many rows were deleted.
	Deleted int64
}

// Result says what Clean deleted.
type Result struct {
	// Cutoff is the point in time, by the database clock, before which
	// rows were deleted.
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

const cutoffSQL = `SELECT now() - $1::bigint * interval '1 microsecond'`

// Clean deletes what idem no longer needs, table by table, in chunks of
// cfg.ChunkSize rows, each chunk one statement in its own transaction:
//
//   - inbox: rows whose message was last seen before the cutoff
//     (inbox.Inbox.Cleanup, which records what each consumer forgot, see
//     inbox.Horizon, and never touches a held scope such as a running
//     online rebuild's);
//   - ledger and ledger_audit: effects settled before the cutoff
//     (succeeded, suppressed, and failed_terminal once an operator resolved
//     them so) with their audit rows. Pending, in-flight, retryable,
//     unknown and unresolved failed_terminal effects are never deleted;
//   - dead_letters: rows dead-lettered before the cutoff;
//   - replay_runs, replay_audit and checkpoints: runs finished (or
//     abandoned) before the cutoff, with their audit rows and their progress
//     checkpoints. Running (or interrupted, resumable) runs are kept;
//   - attempts: failure counts last updated before the cutoff;
//   - http_keys: HTTP idempotency keys past their own expiry
//     (httpinbox.Config.Expiry), whatever the cutoff; an unknown outcome
//     stays until an operator resolves it.
//
// The cutoff is now() - cfg.OlderThan, fixed when Clean starts. Clean
// refuses an OlderThan below cfg.Floor with ErrBelowFloor before deleting
// anything. It skips rows that running transactions hold locked and never
// waits for them. On error (or when ctx ends) it returns what it deleted so
// far with the error; the next call goes on from there.
func Clean(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	var res Result
	if err := cfg.Pool.QueryRow(ctx, cutoffSQL, cfg.OlderThan.Microseconds()).Scan(&res.Cutoff); err != nil {
		return res, fmt.Errorf("retention: cutoff: %w", err)
	}
	for _, t := range []func(context.Context, Config, *Result) error{cleanInbox, cleanTables, cleanHTTPKeys} {
		if err := t(ctx, cfg, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// cleanInbox deletes expired inbox rows through the inbox package, which
// records the consumers' horizons.
func cleanInbox(ctx context.Context, cfg Config, res *Result) error {
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables})
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	r, err := ib.Cleanup(ctx, cfg.Pool, inbox.CleanupOptions{
		ChunkSize: cfg.ChunkSize, OlderThan: cfg.OlderThan, Floor: cfg.Floor,
	})
	res.add("inbox", r.Deleted)
	if err != nil {
		return fmt.Errorf("retention: inbox: %w", err)
	}
	return nil
}

// cleanHTTPKeys deletes expired HTTP idempotency keys through httpinbox.
func cleanHTTPKeys(ctx context.Context, cfg Config, res *Result) error {
	n, err := httpinbox.CleanupExpired(ctx, cfg.Pool, cfg.Tables, cfg.ChunkSize)
	res.add("http_keys", int64(n))
	if err != nil {
		return fmt.Errorf("retention: http_keys: %w", err)
	}
	return nil
}

// cleanTables has each of the other tables' owners delete what aged past
// the cutoff, chunk by chunk, in this order: the ledger's settled effects,
// dead-letter rows, finished replay runs, attempt counts. Every table idem
// owns is cleaned here or by Clean's other steps, except the live
// consumers' checkpoints, the inbox horizons and the migrations table,
// which do not grow with traffic; a new table that grows with traffic gets
// a delete function in the package that owns it, called from here.
func cleanTables(ctx context.Context, cfg Config, res *Result) error {
	for _, t := range []string{"ledger", "ledger_audit", "dead_letters", "replay_runs", "replay_audit", "checkpoints", "attempts"} {
		res.add(t, 0)
	}
	effects, audits, err := ledger.DeleteSettled(ctx, cfg.Pool, cfg.Tables, res.Cutoff, cfg.ChunkSize)
	res.add("ledger", effects)
	res.add("ledger_audit", audits)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	n, err := deadletters.DeleteBefore(ctx, cfg.Pool, cfg.Tables, res.Cutoff, cfg.ChunkSize)
	res.add("dead_letters", n)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	runs, audits, checkpoints, err := replay.DeleteFinishedRuns(ctx, cfg.Pool, cfg.Tables, res.Cutoff, cfg.ChunkSize)
	res.add("replay_runs", runs)
	res.add("replay_audit", audits)
	res.add("checkpoints", checkpoints)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	n, err = engine.DeleteAttemptsBefore(ctx, cfg.Pool, cfg.Tables, res.Cutoff, cfg.ChunkSize)
	res.add("attempts", n)
	if err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	return nil
}
