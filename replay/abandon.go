package replay

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/parked"
	"github.com/idemkit/idem/internal/shadow"
)

// abandonSQL marks a run abandoned, if it is still running.
const abandonSQL = `UPDATE %s SET status = 'abandoned', finished_at = now() WHERE run_id = $1 AND status = 'running'`

// Abandon gives up the interrupted online rebuild runID, whose tables are in
// tables: it drops its shadow tables, deletes the inbox rows and parked
// events it kept beside the live ones (releasing its inbox scope, see
// inbox.Inbox.Hold), and marks the run abandoned. The live projection and
// the live consumer are untouched; a new rebuild may start. Abandoning an
// abandoned run finishes its clean-up. It fails with ErrRebuildRunning while
// a process runs the rebuild, and with ErrRunMismatch for a run that is not
// an unfinished online rebuild.
func Abandon(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, runID string) error {
	row, err := loadRun(ctx, pool, tables, runID)
	switch {
	case err != nil:
		return err
	case row == nil:
		return fmt.Errorf("%w: there is no run %s", ErrRunMismatch, runID)
	case row.mode != string(idem.Rebuild) || row.projection == nil:
		return fmt.Errorf("%w: run %s is not an online rebuild: there is nothing to abandon", ErrRunMismatch, runID)
	case row.status == "finished":
		return fmt.Errorf("%w: run %s finished: there is nothing to abandon", ErrRunMismatch, runID)
	}
	lock, err := lockRebuild(ctx, pool, tables, row.consumer, row.stream, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	if row.status == "running" {
		if err := abandon(ctx, pool, tables, row); err != nil {
			return err
		}
	}
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if _, err := ib.DeleteScope(ctx, pool, rebuildScope(row.consumer, runID)); err != nil {
		return fmt.Errorf("replay: abandon run %s (run it again to finish): %w", runID, err)
	}
	return nil
}

// abandon marks the running rebuild row abandoned, releases its inbox
// scope, drops its shadows and deletes its parked events, in one
// transaction.
func abandon(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, row *run) error {
	runID := row.id
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, fmt.Sprintf(abandonSQL, tables.Table("replay_runs")), runID)
		if err != nil {
			return fmt.Errorf("replay: abandon run %s: %w", runID, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%w: run %s finished meanwhile", ErrRunMismatch, runID)
		}
		ib, err := inbox.New(inbox.Config{Tables: tables})
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if err := ib.Release(ctx, tx, rebuildScope(row.consumer, runID)); err != nil {
			return fmt.Errorf("replay: abandon run %s: %w", runID, err)
		}
		if err := parked.New(tables).Delete(ctx, tx, shadow.Scope(*row.projection)); err != nil {
			return fmt.Errorf("replay: abandon run %s: delete its parked events: %w", runID, err)
		}
		return shadowSet{schema: *row.schema, tables: row.tables}.drop(ctx, tx)
	})
}
