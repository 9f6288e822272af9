package replay

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/ledger"
)

// segment says how a run of consecutive messages is processed.
type segment struct {
	// policy is the batches' policy, hooks aside; its Mode also goes into
	// the handlers' context (idem.WithMode).
	policy engine.Ordered
	// scopes are the checkpoints advanced in each batch's transaction.
	scopes []string
	// audit writes a repair audit row per settled, selected message.
	audit bool
	// catchUp marks a rebuild's messages past the live checkpoint.
	catchUp bool
}

// segments returns how the run processes messages: one segment, or for a
// rebuild, one up to the live checkpoint and one for the catch-up after it.
func (r *runner) segments() (main, catchUp *segment) {
	if r.o.Mode == idem.Forensic {
		return &segment{policy: engine.Ordered{Mode: idem.Forensic}}, nil
	}
	own := runScope(r.cfg.Name, r.row.id)
	switch r.o.Mode {
	case idem.Rebuild:
		// The rebuild's own batches may commit asynchronously: a crash
		// loses their projection writes together with the checkpoint that
		// covers them, and the resumed run redoes them; effects are
		// suppressed. The catch-up segment acts for the live consumer and
		// commits synchronously.
		return &segment{policy: engine.Ordered{Mode: idem.Rebuild, Scope: rebuildScope(r.cfg.Name, r.row.id)}, scopes: []string{own}},
			&segment{policy: engine.Ordered{Mode: idem.Normal}, scopes: []string{own, r.cfg.Name}, catchUp: true}
	case idem.Repair:
		return &segment{policy: engine.Ordered{Mode: idem.Repair, Select: r.o.Select.matcher()}, scopes: []string{own}, audit: true}, nil
	default:
		return &segment{policy: engine.Ordered{Mode: idem.Normal}, scopes: []string{own}}, nil
	}
}

// batch processes consecutive records read from the stream.
func (r *runner) batch(ctx context.Context, recs []streamio.Record) error {
	items := r.items(recs)
	if r.main == nil {
		r.main, r.catchUp = r.segments()
	}
	k := len(items)
	if r.catchUp != nil {
		live := *r.row.live
		k = sort.Search(len(items), func(i int) bool { return items[i].Offset > live })
	}
	if k > 0 {
		if err := r.process(ctx, r.main, items[:k]); err != nil {
			return err
		}
	}
	if k < len(items) {
		return r.process(ctx, r.catchUp, items[k:])
	}
	return nil
}

// process runs items in seg's way, in order (engine.RunOrdered): a message
// whose handler fails is retried in place until it succeeds or is
// dead-lettered (max_attempts), and nothing after it commits before it, so
// a resumed run (which re-reads from its checkpoint) never applies a message
// twice, not even a repair's re-run.
func (r *runner) process(ctx context.Context, seg *segment, items []*engine.Item) error {
	o := seg.policy
	ctx = idem.WithMode(ctx, o.Mode)
	o.RetryBaseDelay, o.RetryMaxDelay = r.o.RetryDelay, 5*time.Second
	var captures map[int64]*ledger.Capture
	if o.Mode == idem.Forensic {
		captures = make(map[int64]*ledger.Capture, len(items))
		o.MessageContext = func(ctx context.Context, it *engine.Item) context.Context {
			ctx, c := ledger.WithCapture(ctx)
			captures[it.Offset] = c
			return ctx
		}
	}
	switch {
	case seg.audit:
		o.BeforeCommit = r.audit
	case o.Mode == idem.Normal && !r.o.AllowBelowHorizon:
		o.BeforeCommit = r.guardHorizon
	}
	if len(seg.scopes) > 0 {
		o.Checkpoint = func(ctx context.Context, tx pgx.Tx, upTo int64) error {
			for _, scope := range seg.scopes {
				if err := store.AdvanceCheckpoint(ctx, tx, r.tables, scope, r.o.Stream, upTo); err != nil {
					return err
				}
			}
			return nil
		}
	}
	o.Settled = func(it *engine.Item, res engine.Result) error { return r.account(seg, it, res, captures[it.Offset]) }
	return r.eng.RunOrdered(ctx, ctx, items, o)
}

// account counts a settled message, and reports it in forensic mode.
func (r *runner) account(seg *segment, it *engine.Item, res engine.Result, capture *ledger.Capture) error {
	s := &r.sum
	s.Messages++
	if s.First < 0 {
		s.First = it.Offset
		r.first.Store(it.Offset)
	}
	s.Last = it.Offset
	if seg.catchUp {
		s.CaughtUp++
	}
	switch res.Outcome {
	case idem.Processed:
		s.Processed++
	case idem.Duplicate:
		s.Duplicates++
	case idem.Skipped:
		s.Skipped++
	case idem.DeadLettered:
		s.DeadLettered++
		if res.Reason == deadletters.ReasonPayloadConflict {
			s.Conflicts++
		}
	case idem.Retried: // forensic only: not retried, reported
		s.Retried++
	}
	r.settled.Add(1)
	r.last.Store(it.Offset)
	if seg.policy.Mode != idem.Forensic {
		return nil
	}
	forgotten := res.Inbox == inbox.NewMessage && it.Offset <= r.forgotten
	switch {
	case forgotten:
		s.Forgotten++
	case res.Inbox == inbox.NewMessage:
		s.InboxNew++
	case res.Inbox == inbox.Duplicate:
		s.InboxDuplicate++
	case res.Inbox == inbox.Conflict:
		s.Conflicts++
	}
	var effects []ledger.Entry
	if capture != nil {
		effects = capture.Effects()
	}
	s.Effects += int64(len(effects))
	return r.report.message(it, res, effects, forgotten)
}

// items prepares recs as the engine's items; a record the stream client
// could not decode is dead-lettered as undecodable, as the live consumer
// does.
func (r *runner) items(recs []streamio.Record) []*engine.Item {
	items := r.eng.PrepareAll(streamio.Messages(r.o.Stream, recs, time.Now()))
	for i := range recs {
		if recs[i].Undecodable != nil {
			items[i].Undecodable(recs[i].Undecodable)
		}
	}
	return items
}
