package replay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/parked"
	"github.com/idemkit/idem/internal/shadow"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
)

// errSwapAgain postpones a swap that could not complete now: the live
// batches in flight or the readers of the live tables held their locks too
// long, or the final catch-up ran past the pause limit. The rebuild
// catches up again and tries anew.
var errSwapAgain = errors.New("replay: swap postponed")

// tableLockTimeout bounds the wait for the live tables' readers at the
// swap; readers that come meanwhile wait behind it.
const tableLockTimeout = 2 * time.Second

// pauseLimit bounds how long a swap holds the live consumer's batches:
// well inside their own wait for the gate (HandlerTimeout).
func (r *runner) pauseLimit() time.Duration { return min(10*time.Second, r.cfg.HandlerTimeout/2) }

// swapIn ends an online rebuild in one transaction: it takes the live
// consumer's swap gate (its batch in flight commits first; the next one
// waits), applies the messages the live consumer committed since the last
// catch-up, hands the inbox over, swaps the tables and finishes the run.
// Readers wait only for the final statements, never see a missing or
// partial table, and read the rebuilt tables afterwards; the live consumer
// goes on from the same checkpoint on the new tables.
func (r *runner) swapIn(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("replay: swap: %w", err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("replay: swap: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommitTimeout)
		_ = tx.Rollback(rctx) // a no-op after commit
		cancel()
	}()
	r.setPhase(phaseSwapping)
	diff, err := r.diffInbox(ctx)
	if err != nil {
		return err
	}
	limit := r.pauseLimit()
	if err := setLocal(ctx, tx, "lock_timeout", r.cfg.HandlerTimeout+r.cfg.CommitTimeout); err != nil {
		return err
	}
	if err := setLocal(ctx, tx, "idle_in_transaction_session_timeout", limit+5*time.Second); err != nil {
		return err
	}
	gate := store.SwapGate(r.tables, r.cfg.Name, r.o.Stream)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, gate); err != nil {
		return postpone("wait for the live batch in flight", err)
	}
	paused := time.Now()
	live, delta, err := r.catchUpPaused(ctx, tx, diff.upTo, limit)
	if err != nil {
		return err
	}
	caughtUp := time.Now()
	if err := r.handOver(ctx, tx, live, diff, delta); err != nil {
		return err
	}
	r.log.Debug("swap", "final_messages", live-diff.upTo, "catch_up", caughtUp.Sub(paused), "hand_over", time.Since(caughtUp))
	if r.o.beforeSwapCommit != nil {
		if err := r.o.beforeSwapCommit(ctx); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommitTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return fmt.Errorf("replay: swap: commit: %w", err)
	}
	r.swapped(live, time.Since(paused))
	return nil
}

// setLocal sets a setting for the rest of tx.
func setLocal(ctx context.Context, tx pgx.Tx, name string, d time.Duration) error {
	ms := strconv.FormatInt(max(d.Milliseconds(), 1), 10)
	if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true)`, name, ms); err != nil {
		return fmt.Errorf("replay: swap: set %s: %w", name, err)
	}
	return nil
}

// postpone turns a lock wait past its timeout into errSwapAgain.
func postpone(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return fmt.Errorf("%w: %s: %w", errSwapAgain, what, err)
	}
	return fmt.Errorf("replay: swap: %s: %w", what, err)
}

// catchUpPaused applies, while the gate holds the live consumer, the
// messages it committed after upTo, the rebuild's position before the
// pause, and returns its checkpoint — where the rebuilt tables hand over —
// with the ids of the messages applied.
func (r *runner) catchUpPaused(ctx context.Context, tx pgx.Tx, upTo int64, limit time.Duration) (int64, []string, error) {
	live, ok, err := store.Checkpoint(ctx, tx, r.tables, r.cfg.Name, r.o.Stream)
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		live = -1
	}
	r.end.Store(live)
	switch done, err := r.applied(ctx, tx); {
	case err != nil:
		return 0, nil, err
	case done != upTo:
		return 0, nil, fmt.Errorf("replay: swap: the rebuild moved from %d to %d outside the swap", upTo, done)
	case live == done:
		return live, nil, nil
	case live < done:
		return 0, nil, fmt.Errorf("replay: the live consumer's checkpoint went back to %d, before the rebuild's %d", live, done)
	}
	var ids []string
	r.seen = func(recs []streamio.Record) {
		for _, it := range r.items(recs) {
			ids = append(ids, it.ID)
		}
	}
	defer func() { r.seen = nil }()
	pctx, cancel := context.WithTimeout(ctx, limit)
	err = r.read(pctx, r.resumeAt(upTo), live)
	cancel()
	if err != nil && ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
		return 0, nil, fmt.Errorf("%w: the final %d messages took longer than %s", errSwapAgain, live-upTo, limit)
	}
	if err != nil {
		return 0, nil, err
	}
	if done, err := r.applied(ctx, tx); err != nil || done != live {
		return 0, nil, errors.Join(err, fmt.Errorf("replay: swap: the rebuild applied up to %d, not the live checkpoint %d", done, live))
	}
	return live, ids, nil
}

// handOver, in the swap transaction, gives the live consumer the rebuild's
// inbox and parked events, swaps the tables and finishes the run.
func (r *runner) handOver(ctx context.Context, tx pgx.Tx, live int64, diff inboxDiff, delta []string) error {
	if err := r.mergeInbox(ctx, tx, diff, delta); err != nil {
		return err
	}
	if err := r.moveParked(ctx, tx); err != nil {
		return err
	}
	if err := setLocal(ctx, tx, "lock_timeout", tableLockTimeout); err != nil {
		return err
	}
	if err := r.shadows(r.row).replace(ctx, tx); err != nil {
		return postpone("swap the tables", err)
	}
	return r.finishRun(ctx, tx, &live)
}

// The inbox hand-over (see inbox.Transfer): the live scope must know
// exactly the messages the rebuilt tables applied, so that a message
// delivered again after the swap is a duplicate if and only if the new
// tables hold it. Rows the inbox retention made the live scope forget (at
// or below its horizon) stay forgotten, and the live rows the hand-over
// deletes move its horizon.
//
// Comparing the scopes reads every row, so it runs before the pause, for
// the messages up to the rebuild's position, which neither scope claims
// again; in the pause, the hand-over applies those differences and the
// messages of the final catch-up, by id.

// inboxDiff is the inbox hand-over prepared before the pause: the
// differences between the scopes up to offset upTo.
type inboxDiff struct {
	upTo          int64
	forget, learn []string
}

// diffInbox compares the scopes up to the rebuild's position.
func (r *runner) diffInbox(ctx context.Context) (inboxDiff, error) {
	d := inboxDiff{}
	var err error
	if d.upTo, err = r.applied(ctx, r.pool); err != nil {
		return d, err
	}
	horizon, err := r.forgottenUpTo(ctx, r.pool)
	if err != nil {
		return d, err
	}
	d.forget, d.learn, err = r.ib.Differences(ctx, r.pool, rebuildScope(r.cfg.Name, r.row.id), r.cfg.Name, r.o.Stream, d.upTo, horizon)
	if err != nil {
		return d, fmt.Errorf("replay: %w", err)
	}
	return d, nil
}

// mergeInbox makes the live inbox scope hold what the rebuild's holds: the
// differences found before the pause, and those among the messages the
// pause applied.
func (r *runner) mergeInbox(ctx context.Context, tx pgx.Tx, d inboxDiff, delta []string) error {
	horizon, err := r.forgottenUpTo(ctx, tx)
	if err != nil {
		return err
	}
	err = r.ib.Transfer(ctx, tx, inbox.Transfer{From: rebuildScope(r.cfg.Name, r.row.id), To: r.cfg.Name,
		Forget: append(d.forget, delta...), Learn: append(d.learn, delta...), ForgottenUpTo: horizon})
	if err != nil {
		return fmt.Errorf("replay: swap: hand the inbox over: %w", err)
	}
	return nil
}

// moveParked replaces the live projection's parked events with the
// rebuild's.
func (r *runner) moveParked(ctx context.Context, tx pgx.Tx) error {
	name := *r.row.projection
	if err := parked.New(r.tables).Replace(ctx, tx, shadow.Scope(name), name); err != nil {
		return fmt.Errorf("replay: swap: move the parked events: %w", err)
	}
	return nil
}

// swapped records a swap that committed.
func (r *runner) swapped(live int64, pause time.Duration) {
	r.pause.Store(int64(pause))
	r.setPhase(phaseSwapped)
	r.sum.Handoff, r.sum.HasHandoff, r.sum.End, r.sum.Pause, r.sum.Swapped = live, true, live, pause, true
	r.row.status = "finished"
	r.log.Info("rebuild swapped in", "projection", *r.row.projection, "handoff", live, "pause", pause,
		"messages", r.sum.Messages, "processed", r.sum.Processed, "duplicates", r.sum.Duplicates)
}

// cleanup deletes the inbox rows of a swapped rebuild's own scope, which
// the swap copied to the live scope.
func (r *runner) cleanup(ctx context.Context) error {
	if _, err := r.ib.DeleteScope(ctx, r.pool, rebuildScope(r.cfg.Name, r.row.id)); err != nil {
		return fmt.Errorf("replay: clean up after run %s (run it again to finish): %w", r.row.id, err)
	}
	return nil
}
