package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// Querier is what reading a checkpoint needs: a pool, a connection or a tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Execer is what writing a checkpoint needs: a transaction, usually.
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
		return 0, false, fmt.Errorf("consumer: read checkpoint %s/%s: %w", scope, stream, err)
	}
	return last, true, nil
}

// AdvanceCheckpoint records offset as the scope's last committed offset of
// stream, inside the caller's transaction. It never moves a checkpoint
// backwards: a reader that lost its lock and commits late cannot undo the
// progress of the one that took over.
func AdvanceCheckpoint(ctx context.Context, tx Execer, tables idem.Tables, scope, stream string, offset int64) error {
	t := tables.Table("checkpoints")
	_, err := tx.Exec(ctx, `INSERT INTO `+t+` AS c (consumer, stream, last_offset) VALUES ($1, $2, $3)
		ON CONFLICT (consumer, stream) DO UPDATE
		SET last_offset = greatest(c.last_offset, EXCLUDED.last_offset), updated_at = now()`, scope, stream, offset)
	if err != nil {
		return fmt.Errorf("consumer: advance checkpoint %s/%s to %d: %w", scope, stream, offset, err)
	}
	return nil
}

// MoveCheckpoint sets the scope's checkpoint of stream to offset, forwards
// or backwards. A rebuild replay uses it to hand the live consumer over at
// the offset where the rebuild ended.
func MoveCheckpoint(ctx context.Context, tx Execer, tables idem.Tables, scope, stream string, offset int64) error {
	t := tables.Table("checkpoints")
	_, err := tx.Exec(ctx, `INSERT INTO `+t+` AS c (consumer, stream, last_offset) VALUES ($1, $2, $3)
		ON CONFLICT (consumer, stream) DO UPDATE SET last_offset = EXCLUDED.last_offset, updated_at = now()`,
		scope, stream, offset)
	if err != nil {
		return fmt.Errorf("consumer: move checkpoint %s/%s to %d: %w", scope, stream, offset, err)
	}
	return nil
}
