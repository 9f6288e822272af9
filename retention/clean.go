package retention

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/httpinbox"
)

// Count is how many rows a cleanup deleted from one table.
type Count struct {
	// Table is the table's name without schema and prefix: "inbox",
	// "ledger", "ledger_audit", "dead_letters", "replay_runs",
	// "replay_audit", "checkpoints" or "http_keys".
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

// cleanTables runs the chunked statements of the other tables.
func cleanTables(ctx context.Context, cfg Config, res *Result) error {
	for _, s := range steps(cfg.Tables) {
		for _, t := range s.tables {
			res.add(t, 0)
		}
		if err := runStep(ctx, cfg.Pool, s, res, cfg.ChunkSize); err != nil {
			return err
		}
	}
	return nil
}

// runStep runs s chunk after chunk until a chunk deletes fewer rows from
// its first table than the chunk size.
func runStep(ctx context.Context, pool *pgxpool.Pool, s step, res *Result, chunk int) error {
	counts := make([]int64, len(s.tables))
	dest := make([]any, len(counts))
	for i := range counts {
		dest[i] = &counts[i]
	}
	for {
		if err := pool.QueryRow(ctx, s.sql, res.Cutoff, chunk).Scan(dest...); err != nil {
			return fmt.Errorf("retention: %s: %w", s.tables[0], err)
		}
		for i, t := range s.tables {
			res.add(t, counts[i])
		}
		if counts[0] < int64(chunk) {
			return nil
		}
	}
}

// step is one chunked statement: $1 is the cutoff, $2 the chunk size; it
// returns one count per table, the first table's count deciding whether
// another chunk is due.
type step struct {
	tables []string
	sql    string
}

// The statements pick their rows with FOR UPDATE SKIP LOCKED, so they never
// wait on a transaction that holds one (a dispatcher writing an outcome, an
// operator resolving an effect, a replay finishing its run).
const (
	ledgerSQL = `WITH doomed AS (
	SELECT effect_id FROM {ledger} AS l
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed')
		AND coalesce(completed_at, created_at) < $1
		AND (status <> 'failed_terminal' OR (SELECT a.to_status FROM {ledger_audit} AS a
			WHERE a.effect_id = l.effect_id ORDER BY a.resolved_at DESC, a.id DESC LIMIT 1) = 'failed_terminal')
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {ledger} AS l USING doomed WHERE l.effect_id = doomed.effect_id RETURNING l.effect_id
), audit AS (
	DELETE FROM {ledger_audit} AS a USING gone WHERE a.effect_id = gone.effect_id RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit)`

	// ageSQL deletes one chunk of rows of table %[1]s whose time column
	// %[2]s is before the cutoff.
	ageSQL = `WITH gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE %[2]s < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))
	RETURNING 1
)
SELECT count(*) FROM gone`

	replayRunsSQL = `WITH doomed AS (
	SELECT run_id FROM {replay_runs} WHERE status IN ('finished', 'abandoned') AND finished_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {replay_runs} AS r USING doomed WHERE r.run_id = doomed.run_id RETURNING r.run_id, r.consumer
), audit AS (
	DELETE FROM {replay_audit} AS a USING gone WHERE a.run_id = gone.run_id RETURNING 1
), progress AS (
	DELETE FROM {checkpoints} AS c USING gone WHERE c.consumer = gone.consumer || '@replay:' || gone.run_id RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit), (SELECT count(*) FROM progress)`
)

// steps returns the chunked statements for t, in the order Clean runs them.
//
// Every table idem owns is cleaned here or by Clean's other steps, except
// the live consumers' checkpoints, the inbox horizons and the migrations
// table, which do not grow with traffic. A new table that grows with
// traffic gets a step here; one whose rows only age is one line:
// ageStep(t, table, time column).
func steps(t idem.Tables) []step {
	names := []string{"ledger", "ledger_audit", "replay_runs", "replay_audit", "checkpoints"}
	pairs := make([]string, 0, 2*len(names))
	for _, n := range names {
		pairs = append(pairs, "{"+n+"}", t.Table(n))
	}
	r := strings.NewReplacer(pairs...)
	return []step{
		{tables: []string{"ledger", "ledger_audit"}, sql: r.Replace(ledgerSQL)},
		ageStep(t, "dead_letters", "dead_lettered_at"),
		{tables: []string{"replay_runs", "replay_audit", "checkpoints"}, sql: r.Replace(replayRunsSQL)},
		ageStep(t, "attempts", "updated_at"),
	}
}

// ageStep deletes the rows of table whose column (a timestamptz) is before
// the cutoff.
func ageStep(t idem.Tables, table, column string) step {
	return step{tables: []string{table}, sql: fmt.Sprintf(ageSQL, t.Table(table), pgx.Identifier{column}.Sanitize())}
}
