// Package store holds a stream consumer's position and what coordinates
// moving it: its checkpoint (written in each batch's transaction), the
// advisory lock that makes one process its reader, and the swap gate that
// orders its batches with a rebuild's swap.
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pglock"
)

// Querier reads: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Execer writes: a transaction, usually.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Checkpoint returns the last stream offset the consumer scope committed for
// stream; ok is false when it has none (start from the first offset).
func Checkpoint(ctx context.Context, q Querier, tables idem.Tables, scope, stream string) (last int64, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT last_offset FROM `+tables.Table("checkpoints")+` WHERE consumer = $1 AND stream = $2`,
		scope, stream).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("store: read checkpoint %s/%s: %w", scope, stream, err)
	}
	return last, true, nil
}

// AdvanceCheckpoint records offset as the scope's last committed offset of
// stream, inside the caller's transaction. It never moves a checkpoint
// backwards: a reader that lost its lock and commits late cannot undo the
// progress of the one that took over.
func AdvanceCheckpoint(ctx context.Context, tx Execer, tables idem.Tables, scope, stream string, offset int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+tables.Table("checkpoints")+` AS c (consumer, stream, last_offset) VALUES ($1, $2, $3)
		ON CONFLICT (consumer, stream) DO UPDATE
		SET last_offset = greatest(c.last_offset, EXCLUDED.last_offset), updated_at = now()`, scope, stream, offset)
	if err != nil {
		return fmt.Errorf("store: advance checkpoint %s/%s to %d: %w", scope, stream, offset, err)
	}
	return nil
}

// MoveCheckpoint sets the scope's checkpoint of stream to offset, forwards
// or backwards. A rebuild hands the live consumer over with it.
func MoveCheckpoint(ctx context.Context, tx Execer, tables idem.Tables, scope, stream string, offset int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+tables.Table("checkpoints")+` AS c (consumer, stream, last_offset) VALUES ($1, $2, $3)
		ON CONFLICT (consumer, stream) DO UPDATE SET last_offset = EXCLUDED.last_offset, updated_at = now()`,
		scope, stream, offset)
	if err != nil {
		return fmt.Errorf("store: move checkpoint %s/%s to %d: %w", scope, stream, offset, err)
	}
	return nil
}

// DeleteCheckpointsSQL is the body of a data-modifying WITH query that
// deletes the checkpoints of the scopes scope names, an expression over the
// rows of the query's earlier part from, and returns 1 per checkpoint
// deleted. A replay run's clean-up deletes its runs' checkpoints with it, in
// the statement that deletes the runs.
func DeleteCheckpointsSQL(tables idem.Tables, from, scope string) string {
	return `DELETE FROM ` + tables.Table("checkpoints") + ` AS c USING ` + from + ` WHERE c.consumer = ` + scope + ` RETURNING 1`
}

// StreamLockKey is the advisory lock that makes one process the active
// reader of a consumer's stream; the others wait as hot standbys. A rebuild
// replay that hands off to the live consumer takes the same lock.
func StreamLockKey(tables idem.Tables, name, stream string) string {
	return "idem/stream/" + tables.WithDefaults().Schema + "/" + name + "/" + stream
}

// SwapGate is the advisory lock id a live stream reader's batches take in
// shared mode as they begin (engine.Ordered.Gate). A rebuild that swaps the
// consumer's projection takes it exclusively, in its swap transaction: the
// live batches in flight finish first, the next ones wait for the swap.
func SwapGate(tables idem.Tables, name, stream string) int64 {
	return pglock.Key("idem/swap/" + tables.WithDefaults().Schema + "/" + name + "/" + stream)
}
