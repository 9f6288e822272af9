package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chunked"
)

// deleteSettledSQL deletes one chunk of effects settled before $1, walking
// them by settle time from $3 (the ledger_settled_idx index), with their
// audit rows, and leaves a tombstone for each in the same statement:
// succeeded, suppressed, and failed_terminal once an operator resolved them
// so. It picks them FOR UPDATE SKIP LOCKED, so it never waits on a
// dispatcher writing an outcome or an operator resolving. A tombstone that
// exists already (the effect was recorded again, suppressed, after a
// retention, and is removed again) keeps how and when the effect first
// settled and takes the new deletion time. The rows it picks are deleted by
// their address (ctid), and their audit rows through the audit's effect
// index, so each effect costs one walk of the settle-time index and one
// heap visit. It returns the counts of effects and audit rows deleted and
// the settle time the next chunk starts from.
const deleteSettledSQL = `WITH doomed AS (
	SELECT ctid, coalesce(completed_at, created_at) AS settled_at FROM {ledger} AS l
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed')
		AND coalesce(completed_at, created_at) >= $3 AND coalesce(completed_at, created_at) < $1
		AND (status <> 'failed_terminal' OR (SELECT a.to_status FROM {ledger_audit} AS a
			WHERE a.effect_id = l.effect_id ORDER BY a.resolved_at DESC, a.id DESC LIMIT 1) = 'failed_terminal')
	ORDER BY coalesce(completed_at, created_at)
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {ledger} WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING effect_id, idempotency_key, status, coalesce(completed_at, created_at) AS settled_at
), buried AS (
	INSERT INTO {tombstones} AS t (effect_id, idempotency_key, status, settled_at)
	SELECT effect_id, idempotency_key, status, settled_at FROM gone
	ON CONFLICT (effect_id) DO UPDATE SET deleted_at = EXCLUDED.deleted_at
), audit AS (
	DELETE FROM {ledger_audit} WHERE effect_id = ANY (ARRAY(SELECT effect_id FROM gone)) RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit), coalesce((SELECT max(settled_at) FROM gone), $3)`

// deleteTombstonesSQL deletes one chunk of tombstones whose effect's row
// retention removed before $1, walking them by deletion time from $3.
const deleteTombstonesSQL = `WITH gone AS (
	DELETE FROM {tombstones} WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {tombstones} WHERE deleted_at >= $3 AND deleted_at < $1
		ORDER BY deleted_at LIMIT $2 FOR UPDATE SKIP LOCKED))
	RETURNING deleted_at
)
SELECT count(*), coalesce(max(deleted_at), $3) FROM gone`

// DeleteSettled deletes the effects of tables settled before cutoff, with
// their audit rows, chunk effects per statement, each its own transaction:
// succeeded, suppressed, and failed_terminal once an operator resolved them
// so. Pending, in-flight, retryable, unknown and unresolved failed_terminal
// effects are never deleted.
//
// Each deleted effect leaves a tombstone in the ledger_tombstones table, in
// the statement that deletes it (a chunk that fails deletes nothing and
// leaves no tombstone): its id, idempotency key, status, when it settled
// and when it was deleted. Record writes an effect recorded again under a
// tombstoned id as suppressed, so retention never makes the ledger send an
// effect twice. Tombstones go only with DeleteTombstones.
//
// Chunks walk the settled effects by settle time, each from where the one
// before it stopped, so the work grows with the effects deleted. It returns
// how many effects and audit rows it deleted (so far, when it fails). The
// retention package (`idem cleanup`) calls it with its ledger cutoff.
func DeleteSettled(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (effects, audits int64, err error) {
	sql, err := cleanupSQL(tables, deleteSettledSQL)
	if err != nil {
		return 0, 0, err
	}
	n, err := chunked.DeleteFrom(ctx, pool, sql, cutoff, chunk, 2, time.Time{})
	if err != nil {
		err = fmt.Errorf("ledger: delete effects settled before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], n[1], err
}

// DeleteTombstones deletes the tombstones of effects whose row retention
// removed before cutoff, chunk per statement, each its own transaction, and
// returns how many it deleted (so far, when it fails). An effect recorded
// again under the id of a deleted tombstone is no longer recognised: it is
// sent. Keep tombstones at least as long as anything can record their
// effects again: the retention of the streams you may replay or repair
// from, of the dead-letter queues you may redrive, and of your producers'
// retries.
func DeleteTombstones(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (int64, error) {
	sql, err := cleanupSQL(tables, deleteTombstonesSQL)
	if err != nil {
		return 0, err
	}
	n, err := chunked.DeleteFrom(ctx, pool, sql, cutoff, chunk, 1, time.Time{})
	if err != nil {
		err = fmt.Errorf("ledger: delete tombstones older than %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], err
}

// cleanupSQL fills the table names of tables into sql.
func cleanupSQL(tables idem.Tables, sql string) (string, error) {
	if err := tables.Validate(); err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	return strings.NewReplacer("{ledger}", tables.Table("ledger"), "{ledger_audit}", tables.Table("ledger_audit"),
		"{tombstones}", tables.Table("ledger_tombstones")).Replace(sql), nil
}
