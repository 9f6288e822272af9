package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/shadow"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
)

// swapAttempts bounds the swaps an online rebuild tries (each one postponed
// when its pause ran too long or readers kept the tables locked).
const swapAttempts = 5

// rebuildLockKey is the advisory lock an online rebuild of a consumer and
// stream holds while it runs: one rebuild at a time, and none abandoned
// under a running one.
func rebuildLockKey(tables idem.Tables, name, stream string) string {
	return "idem/rebuild/" + tables.WithDefaults().Schema + "/" + name + "/" + stream
}

// lockRebuild takes the rebuild lock, or fails with ErrRebuildRunning.
func lockRebuild(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, name, stream string, logger *slog.Logger) (*pglock.Lock, error) {
	key := rebuildLockKey(tables, name, stream)
	lock, err := pglock.TryAcquire(ctx, pool, key, pglock.Config{Logger: logger})
	if errors.Is(err, pglock.ErrHeld) {
		return nil, fmt.Errorf("%w (%s)", ErrRebuildRunning, key)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return lock, nil
}

// runOnline rebuilds the projection's tables beside the live ones, catches
// up with the live consumer and swaps them in.
func (r *runner) runOnline(ctx context.Context) error {
	lock, err := lockRebuild(ctx, r.pool, r.tables, r.cfg.Name, r.o.Stream, r.log)
	if err != nil {
		return err
	}
	ctx, release := r.hold(ctx, lock)
	defer release()
	done, err := r.startOnline(ctx)
	if err != nil || r.row.status == "finished" {
		return err
	}
	r.sum.RunID = r.row.id
	r.log = r.log.With("run_id", r.row.id)
	r.log.Info("online rebuild started", "projection", r.proj.Name(), "tables", r.proj.Tables(),
		"after", done, "resumed", r.sum.Resumed)
	r.main = &segment{policy: engine.Ordered{Mode: idem.Rebuild, Scope: rebuildScope(r.cfg.Name, r.row.id)},
		scopes: []string{runScope(r.cfg.Name, r.row.id)}}
	if err := r.build(shadow.With(ctx, r.proj.Name()), done); err != nil {
		return r.resumable(ctx, err)
	}
	return r.cleanup(ctx)
}

// startOnline registers a new online rebuild, creating its shadow tables,
// or loads the interrupted one; it returns the last offset already applied
// to the shadows (From − 1 for a new run).
func (r *runner) startOnline(ctx context.Context) (int64, error) {
	if r.o.RunID != "" {
		row, err := r.getRun(ctx, r.o.RunID)
		if err != nil {
			return 0, err
		}
		if row != nil {
			return r.resumeOnline(ctx, row)
		}
	}
	if err := r.refusePending(ctx); err != nil {
		return 0, err
	}
	live, err := r.liveCheckpoint(ctx)
	if err != nil {
		return 0, err
	}
	if r.o.From.kind() == streamio.PositionOffset && r.o.From.at() > live+1 {
		return 0, invalid("the rebuild would start at offset %d, after the live consumer's checkpoint %d: "+
			"(%d, %d) would be missing from the rebuilt tables; start at %d or earlier", r.o.From.at(), live, live, r.o.From.at(), live+1)
	}
	if r.o.From.kind() == streamio.PositionTime {
		return 0, invalid("a rebuild starts from first or an offset, not a time")
	}
	id := r.o.RunID
	if id == "" {
		id = newRunID(r.o.now())
	}
	name, schema := r.proj.Name(), r.proj.Schema()
	row := &run{id: id, mode: string(idem.Rebuild), consumer: r.cfg.Name, stream: r.o.Stream,
		from: r.o.From.String(), to: r.o.To.String(), end: live, live: &live, status: "running",
		projection: &name, schema: &schema, tables: r.proj.Tables()}
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := r.insertRun(ctx, tx, row); err != nil {
			return err
		}
		if err := r.holdScope(ctx, tx, row); err != nil {
			return err
		}
		return r.shadows(row).create(ctx, tx)
	})
	if err != nil {
		return 0, err
	}
	r.row = row
	if r.o.From.kind() == streamio.PositionOffset {
		return r.o.From.at() - 1, nil
	}
	return -1, nil
}

// pendingSQL finds an unfinished online rebuild of a consumer and stream.
const pendingSQL = `SELECT run_id FROM %s WHERE consumer = $1 AND stream = $2 AND mode = 'rebuild'
	AND status = 'running' AND projection IS NOT NULL ORDER BY started_at LIMIT 1`

// refusePending fails with ErrRebuildPending while an interrupted online
// rebuild of the consumer keeps its shadow tables.
func (r *runner) refusePending(ctx context.Context) error {
	var id string
	err := r.pool.QueryRow(ctx, fmt.Sprintf(pendingSQL, r.tables.Table("replay_runs")), r.cfg.Name, r.o.Stream).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("replay: look for an interrupted rebuild: %w", err)
	}
	return fmt.Errorf("%w: run %s: resume it (--run-id %s) or abandon it (--abandon --run-id %s)", ErrRebuildPending, id, id, id)
}

// resumeOnline continues the interrupted online rebuild row, or finishes
// the clean-up of a finished one.
func (r *runner) resumeOnline(ctx context.Context, row *run) (int64, error) {
	if row.mode != string(idem.Rebuild) || row.consumer != r.cfg.Name || row.stream != r.o.Stream ||
		row.projection == nil || *row.projection != r.proj.Name() || *row.schema != r.proj.Schema() ||
		!slices.Equal(row.tables, r.proj.Tables()) {
		return 0, fmt.Errorf("%w: run %s is a %s replay of %s by %s (projection %v)", ErrRunMismatch,
			row.id, row.mode, row.stream, row.consumer, row.tables)
	}
	r.row = row
	r.sum.Resumed = true
	r.sum.RunID, r.sum.End = row.id, row.end
	switch row.status {
	case "abandoned":
		return 0, fmt.Errorf("%w: run %s was abandoned: start a new rebuild", ErrRunMismatch, row.id)
	case "finished":
		r.sum.Handoff, r.sum.HasHandoff, r.sum.Swapped = *row.handoff, true, true
		r.log.Info("replay run already finished", "run_id", row.id)
		return 0, r.cleanup(ctx)
	}
	missing, err := r.shadows(row).missing(ctx, r.pool)
	if err != nil {
		return 0, err
	}
	if len(missing) > 0 {
		return 0, fmt.Errorf("%w: run %s: its shadow tables %q are gone: abandon it and start a new rebuild",
			ErrRunMismatch, row.id, missing)
	}
	if err := r.checkOwnScope(ctx, row); err != nil {
		return 0, err
	}
	r.o.From = mustParse(row.from)
	return r.applied(ctx, r.pool)
}

// applied returns the last offset applied to the shadows: the run's
// checkpoint, or the offset before its start when it has none.
func (r *runner) applied(ctx context.Context, q store.Querier) (int64, error) {
	last, ok, err := store.Checkpoint(ctx, q, r.tables, runScope(r.cfg.Name, r.row.id), r.o.Stream)
	switch {
	case err != nil:
		return 0, err
	case ok:
		return last, nil
	case r.o.From.kind() == streamio.PositionOffset:
		return r.o.From.at() - 1, nil
	default:
		return -1, nil
	}
}

// shadows returns the shadow tables of row.
func (r *runner) shadows(row *run) shadowSet {
	return shadowSet{schema: *row.schema, tables: row.tables}
}

// build applies the stream to the shadows up to the live consumer's
// checkpoint, again and again while the live consumer moves on, until the
// lag is small enough (or stops shrinking), then swaps.
func (r *runner) build(ctx context.Context, done int64) (err error) {
	r.setPhase(phaseBuilding)
	if r.o.Progress != nil {
		prog := startProgress(r.o.Progress, r.o.ProgressInterval, string(r.o.Mode)+" "+r.o.Stream, Offset(done+1), r.tally)
		defer func() { prog.stop(err == nil) }()
	}
	prev, attempt := int64(math.MaxInt64), 0
	for {
		live, err := r.liveCheckpoint(ctx)
		if err != nil {
			return err
		}
		r.end.Store(live)
		if live < done {
			return fmt.Errorf("replay: the live consumer's checkpoint went back to %d, before the rebuild's %d", live, done)
		}
		if lag := live - done; lag > int64(r.o.BatchSize) && lag < prev {
			prev = lag
			if err := r.read(ctx, r.resumeAt(done), live); err != nil {
				return err
			}
			if done, err = r.applied(ctx, r.pool); err != nil {
				return err
			}
			r.setPhase(phaseCatchingUp)
			continue
		}
		if attempt == 0 {
			// Plan the first queries on the swapped-in tables well.
			if err := r.shadows(r.row).analyze(ctx, r.pool); err != nil {
				return err
			}
		}
		attempt++
		err = r.swapIn(ctx)
		if !errors.Is(err, errSwapAgain) || attempt >= swapAttempts {
			return err
		}
		r.log.Warn("swap postponed; catching up again", "attempt", attempt, "error", err)
		if !retry.Sleep(ctx, retry.Backoff(attempt, 200*time.Millisecond, 5*time.Second)) {
			return context.Cause(ctx)
		}
		prev = math.MaxInt64
		r.setPhase(phaseCatchingUp)
		if done, err = r.applied(ctx, r.pool); err != nil {
			return err
		}
	}
}

// resumeAt is where reading continues after offset done: the run's start
// before anything was applied.
func (r *runner) resumeAt(done int64) Position {
	if done < 0 && r.o.From.kind() != streamio.PositionOffset {
		return r.o.From
	}
	return Offset(done + 1)
}
