package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/streamio"
)

// Every mode asks the inbox horizon (inbox.Horizon) before it reads:
//
//   - normal: the first record of the range, and on resume the checkpoint,
//     must be past the live consumer's horizon (checkHorizon), and so must
//     every message a batch claims as new (guardHorizon), which a rebuild's
//     catch-up checks too;
//   - rebuild: the run's own inbox scope is held against retention while
//     the run may still resume (holdScope), and a run whose scope lost rows
//     anyway refuses to resume (checkOwnScope); an online rebuild's swap
//     records the live horizon for the rows it makes the live scope forget;
//   - forensic: records at or below the horizon are reported "forgotten",
//     not "new" (forgottenUpTo);
//   - repair re-runs its selection whatever the inbox holds, by design, and
//     audits what the inbox held.

// errFirst stops the read that finds the first record of the range.
var errFirst = errors.New("replay: first record found")

// checkHorizon refuses a normal replay whose first record (from on) could
// have lost its row in the live consumer's inbox: one at or below the
// highest offset at which retention forgot a copy, or, where the forgotten
// rows had no offsets, one published no later than the newest forgotten
// sighting. An empty range passes.
func (r *runner) checkHorizon(ctx context.Context, from Position, end int64) error {
	if r.o.Mode != idem.Normal || r.o.AllowBelowHorizon || end < 0 {
		return nil
	}
	first, found, err := r.firstRecord(ctx, from, end)
	if err != nil || !found {
		return err
	}
	if err := r.belowHorizon(ctx, r.pool, &first.Message); err != nil {
		return fmt.Errorf("replay: the range starts below the inbox horizon: %w; "+
			"or allow it deliberately (AllowBelowHorizon, --allow-below-horizon)", err)
	}
	return nil
}

// belowHorizon returns an error wrapping inbox.ErrBeyondHorizon when m
// could have lost its row in the live consumer's inbox: it is at or below
// the highest offset at which retention forgot a copy, or, where the
// forgotten rows had no offsets, published no later than the newest
// forgotten sighting.
func (r *runner) belowHorizon(ctx context.Context, q inbox.Querier, m *idem.Message) error {
	h, forgot, err := r.ib.Horizon(ctx, q, r.cfg.Name, r.o.Stream)
	switch {
	case err != nil:
		return fmt.Errorf("replay: %w", err)
	case !forgot:
		return nil
	case h.Offset != nil:
		return r.ib.CheckOffset(ctx, q, r.cfg.Name, r.o.Stream, m.Offset)
	case !m.Timestamp.IsZero():
		return r.ib.CheckSeen(ctx, q, r.cfg.Name, m.Timestamp)
	}
	return nil
}

// guardHorizon is the last step of each transaction of a batch that claims
// in the live consumer's scope (a normal replay, a rebuild's catch-up). The
// run checked the horizon before it read, but a retention clean-up may have
// run since and deleted rows further on in the range: the first message of
// the batch that the inbox did not hold, if it is now below the horizon,
// ends the run, and the transaction rolls back. The check follows the
// batch's claims in its READ COMMITTED transaction, so it sees the horizon
// of a clean-up that deleted a row the batch then claimed as new: the
// clean-up records it in the statement that deletes the row, and the claim
// waits for that statement to commit. As at the start, the horizon is the
// stream's: a row whose copies all came from another source, or a copy at
// an offset above every one its deleted row recorded, is not refused.
func (r *runner) guardHorizon(ctx context.Context, tx pgx.Tx, items []*engine.Item, results []engine.Result) error {
	var first *engine.Item
	for i, it := range items {
		if results[i].Inbox == inbox.NewMessage && (first == nil || it.Offset < first.Offset) {
			first = it
		}
	}
	if first == nil {
		return nil
	}
	if err := r.belowHorizon(ctx, tx, first.Message); err != nil {
		return engine.Stop(fmt.Errorf("replay: message %q at offset %d may have lost its inbox row to a clean-up during the run: %w; "+
			"to apply it anyway, resume with AllowBelowHorizon (--allow-below-horizon)", first.ID, first.Offset, err))
	}
	return nil
}

// firstRecord returns the first record of [from, end]; found is false when
// the range holds none.
func (r *runner) firstRecord(ctx context.Context, from Position, end int64) (first streamio.Record, found bool, err error) {
	spec := streamio.ReadSpec{Stream: r.o.Stream, From: from.stream(), To: Offset(end).stream(), MaxBatch: 1}
	err = r.env.Read(ctx, spec, func(_ context.Context, recs []streamio.Record) error {
		first, found = recs[0], true
		return errFirst
	})
	if err != nil && !errors.Is(err, errFirst) {
		return streamio.Record{}, false, fmt.Errorf("replay: find the first record: %w", err)
	}
	return first, found, nil
}

// forgottenUpTo returns the highest offset of the stream at which the live
// consumer forgot a copy of a message, -1 for none. A forensic replay
// reports the messages up to it as "forgotten", since the inbox can no
// longer say whether they were processed; the swap keeps them forgotten.
func (r *runner) forgottenUpTo(ctx context.Context, q inbox.Querier) (int64, error) {
	h, forgot, err := r.ib.Horizon(ctx, q, r.cfg.Name, r.o.Stream)
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	if !forgot || h.Offset == nil {
		return -1, nil
	}
	return *h.Offset, nil
}

// holdScope holds a rebuild's own inbox scope against retention, in the
// transaction that registers the run: a run interrupted for longer than the
// retention still knows every message it applied when it resumes.
// finishRun and Abandon release it.
func (r *runner) holdScope(ctx context.Context, tx pgx.Tx, row *run) error {
	if err := r.ib.Hold(ctx, tx, rebuildScope(row.consumer, row.id), "rebuild run "+row.id); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// checkOwnScope refuses to resume a rebuild whose own inbox scope lost rows
// to retention anyway (deleted by hand, or before scopes were held): it no
// longer knows every message it applied, and would apply some again.
func (r *runner) checkOwnScope(ctx context.Context, row *run) error {
	scope := rebuildScope(row.consumer, row.id)
	hs, err := r.ib.Horizons(ctx, r.pool, scope)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if len(hs) > 0 {
		return fmt.Errorf("%w: run %s cannot resume: retention deleted rows of its own inbox scope %q "+
			"(messages last seen until %s), so it no longer knows every message it applied; abandon it and start a new rebuild",
			inbox.ErrBeyondHorizon, row.id, scope, hs[0].SeenAt.UTC().Format(time.RFC3339))
	}
	return nil
}
