package replay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/ledger"
)

// batchTries is how many times a batch whose transaction failed as a whole
// (connection lost, commit failed) runs before the replay stops; it is
// resumable from its checkpoint.
const batchTries = 5

// segment says how a run of consecutive messages is processed.
type segment struct {
	// mode goes into the handlers' context (idem.WithMode).
	mode idem.Mode
	// opts are the batch options, BeforeCommit and MessageContext aside.
	opts consumer.BatchOptions
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
		return &segment{mode: idem.Forensic, opts: consumer.BatchOptions{ReadOnly: true}}, nil
	}
	own := runScope(r.cfg.Name, r.row.id)
	switch r.o.Mode {
	case idem.Rebuild:
		// The rebuild's own batches may commit asynchronously: a crash
		// loses their projection writes together with the checkpoint that
		// covers them, and the resumed run redoes them; effects are
		// suppressed. The catch-up segment acts for the live consumer and
		// commits synchronously.
		return &segment{mode: idem.Rebuild, opts: consumer.BatchOptions{Scope: rebuildScope(r.cfg.Name, r.row.id), AsyncCommit: true},
				scopes: []string{own}},
			&segment{mode: idem.Normal, scopes: []string{own, r.cfg.Name}, catchUp: true}
	case idem.Repair:
		return &segment{mode: idem.Repair, opts: consumer.BatchOptions{Only: r.o.Select.matcher(), Rerun: true},
			scopes: []string{own}, audit: true}, nil
	default:
		return &segment{mode: idem.Normal, scopes: []string{own}}, nil
	}
}

// batch processes consecutive records read from the stream.
func (r *runner) batch(ctx context.Context, recs []streamio.Record) error {
	ins := make([]consumer.Incoming, len(recs))
	read := time.Now() // ReceivedAt, kept when a message is run again
	for i, rec := range recs {
		ins[i] = consumer.Incoming{
			MessageID: rec.MessageID, Body: rec.Body, Headers: rec.ApplicationProperties,
			ContentType: rec.Properties.ContentType, CorrelationID: rec.Properties.CorrelationID,
			Source: r.o.Stream, Offset: rec.Offset, HasOffset: true, Timestamp: rec.Timestamp, Attempt: 1,
			ReceivedAt: read,
		}
	}
	if r.main == nil {
		r.main, r.catchUp = r.segments()
	}
	k := len(ins)
	if r.catchUp != nil {
		live := *r.row.live
		k = sort.Search(len(ins), func(i int) bool { return ins[i].Offset > live })
	}
	if k > 0 {
		if err := r.process(ctx, r.main, ins[:k]); err != nil {
			return err
		}
	}
	if k < len(ins) {
		return r.process(ctx, r.catchUp, ins[k:])
	}
	return nil
}

// process runs ins as one batch in seg's way, then retries the messages
// whose handler failed, in place, until they succeed or the consumer
// dead-letters them (max_attempts). The checkpoint never passes a message
// that is not settled.
func (r *runner) process(ctx context.Context, seg *segment, ins []consumer.Incoming) error {
	ctx = idem.WithMode(ctx, seg.mode)
	last := ins[len(ins)-1].Offset
	pending := ins
	for attempt := 1; ; attempt++ {
		batch := pending
		opts := seg.opts
		// In order: nothing after a retried message commits before it, so
		// a resumed run (which re-reads from its checkpoint) never applies
		// a message twice, not even a repair's re-run.
		opts.StopAtRetry = true
		var captures map[int64]*ledger.Capture
		if seg.mode == idem.Forensic {
			captures = make(map[int64]*ledger.Capture, len(batch))
			opts.MessageContext = func(ctx context.Context, m *consumer.Message) context.Context {
				ctx, c := ledger.WithCapture(ctx)
				captures[m.Offset] = c
				return ctx
			}
		} else {
			opts.BeforeCommit = func(ctx context.Context, tx pgx.Tx, outs []consumer.Outcome) error {
				return r.beforeCommit(ctx, tx, seg, batch, outs, last)
			}
		}
		outs, err := r.processBatch(ctx, batch, opts)
		if err != nil {
			return err
		}
		pending = nil
		for i, o := range outs {
			if o.Result == "deferred" {
				pending = append(pending, batch[i]) // after the retried message
				continue
			}
			if o.Result == "retried" && seg.mode != idem.Forensic {
				in := batch[i]
				r.log.Info("handler failed, retrying in place", "offset", in.Offset, "attempt", in.Attempt, "error", errorText(o.Err))
				in.Attempt++
				pending = append(pending, in)
				continue
			}
			if err := r.account(seg, o, captures[o.Offset]); err != nil {
				return err
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if !sleep(ctx, backoff(attempt, r.o.RetryDelay, 5*time.Second)) {
			return ctx.Err()
		}
	}
}

// beforeCommit writes, inside the batch transaction, the repair audit rows
// and the checkpoints: up to the last record, or to just before the first
// message that is retried.
func (r *runner) beforeCommit(ctx context.Context, tx pgx.Tx, seg *segment, batch []consumer.Incoming, outs []consumer.Outcome, last int64) error {
	upTo := last
	for i, o := range outs {
		if o.Result == "retried" || o.Result == "deferred" {
			upTo = batch[i].Offset - 1
			break
		}
	}
	if seg.audit {
		if err := r.audit(ctx, tx, outs); err != nil {
			return err
		}
	}
	if upTo < 0 {
		return nil
	}
	for _, scope := range seg.scopes {
		if err := consumer.AdvanceCheckpoint(ctx, tx, r.tables, scope, r.o.Stream, upTo); err != nil {
			return err
		}
	}
	return nil
}

// processBatch runs one batch, again after a failure of its transaction as
// a whole, up to batchTries times.
func (r *runner) processBatch(ctx context.Context, batch []consumer.Incoming, opts consumer.BatchOptions) ([]consumer.Outcome, error) {
	for try := 1; ; try++ {
		outs, err := r.c.ProcessWith(ctx, batch, opts)
		if err == nil {
			return outs, nil
		}
		if !consumer.IsBatchError(err) || ctx.Err() != nil || try >= batchTries {
			return nil, fmt.Errorf("batch at offset %d: %w", batch[0].Offset, err)
		}
		r.log.Warn("batch failed, retrying", "offset", batch[0].Offset, "size", len(batch), "try", try, "error", err)
		if !sleep(ctx, backoff(try, 100*time.Millisecond, 5*time.Second)) {
			return nil, ctx.Err()
		}
	}
}

// account counts a settled message, and reports it in forensic mode.
func (r *runner) account(seg *segment, o consumer.Outcome, capture *ledger.Capture) error {
	s := &r.sum
	s.Messages++
	if s.First < 0 {
		s.First = o.Offset
		r.first.Store(o.Offset)
	}
	s.Last = o.Offset
	if seg.catchUp {
		s.CaughtUp++
	}
	switch o.Result {
	case "processed":
		s.Processed++
	case "duplicate":
		s.Duplicates++
	case "skipped":
		s.Skipped++
	case "dead_lettered":
		s.DeadLettered++
		if o.Reason == consumer.ReasonPayloadConflict {
			s.Conflicts++
		} else {
			s.HandlerErrors++
		}
	case "retried": // forensic only: not retried, reported
		s.HandlerErrors++
	}
	r.settled.Add(1)
	r.last.Store(o.Offset)
	if seg.mode != idem.Forensic {
		return nil
	}
	switch o.Inbox {
	case "new":
		s.NotProcessed++
	case "duplicate":
		s.ProcessedSameHash++
	case "conflict":
		s.Conflicts++
	}
	var effects []ledger.Entry
	if capture != nil {
		effects = capture.Effects()
	}
	s.Effects += int64(len(effects))
	return r.report.message(o, effects)
}

// backoff is base·2^(attempt-1), capped, with ±20% jitter.
func backoff(attempt int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

// sleep waits d or until ctx ends; it reports whether the wait was complete.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
