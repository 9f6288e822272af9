package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/streamio"
)

// ErrBelowHorizon means a normal replay would start at a message the live
// consumer's inbox no longer remembers: retention deleted its row (see
// inbox.Inbox.Horizon), so the replay would run the handler again on a
// message it already applied. Start after the horizon, or set
// Options.AllowBelowHorizon to run them again deliberately.
var ErrBelowHorizon = errors.New("replay: the start is below the inbox horizon")

// errFirst stops the read that finds the first record of the range.
var errFirst = errors.New("replay: first record found")

// checkHorizon refuses a normal replay whose first record is at or below the
// inbox horizon of the live consumer on the stream: the highest offset (or,
// for rows without one, the newest receipt) that retention deleted from its
// inbox. The first record is the one the replay would read first, found by
// reading the range up to end; an empty range passes.
func (r *runner) checkHorizon(ctx context.Context, end int64) error {
	if r.o.Mode != idem.Normal || r.o.AllowBelowHorizon || end < 0 {
		return nil
	}
	ib, err := inbox.New(inbox.Config{Tables: r.tables})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	h, forgot, err := ib.Horizon(ctx, r.pool, r.cfg.Name, r.o.Stream)
	if err != nil || !forgot {
		return err
	}
	first, found, err := r.firstRecord(ctx, end)
	if err != nil || !found {
		return err
	}
	if h.Offset != nil && first.Offset <= *h.Offset {
		return fmt.Errorf("%w: consumer %q forgot offsets up to %d of %s (retention, at %s) and the replay would start at %d: "+
			"their handlers would run again; start at %d or later, or allow it deliberately (AllowBelowHorizon, --allow-below-horizon)",
			ErrBelowHorizon, r.cfg.Name, *h.Offset, r.o.Stream, h.UpdatedAt.UTC().Format("2006-01-02T15:04:05Z"),
			first.Offset, *h.Offset+1)
	}
	if h.Offset == nil && !first.Timestamp.IsZero() && !first.Timestamp.After(h.ReceivedAt) {
		return fmt.Errorf("%w: consumer %q forgot messages of %s received until %s and the replay would start at a message created %s: "+
			"start later, or allow it deliberately (AllowBelowHorizon, --allow-below-horizon)",
			ErrBelowHorizon, r.cfg.Name, r.o.Stream, h.ReceivedAt.UTC().Format("2006-01-02T15:04:05Z"),
			first.Timestamp.UTC().Format("2006-01-02T15:04:05Z"))
	}
	return nil
}

// firstRecord returns the first record of [Options.From, end]; found is false
// when the range holds none.
func (r *runner) firstRecord(ctx context.Context, end int64) (first streamio.Record, found bool, err error) {
	spec := streamio.ReadSpec{Stream: r.o.Stream, From: r.o.From.stream(), To: Offset(end).stream(), MaxBatch: 1}
	err = r.env.Read(ctx, spec, func(_ context.Context, recs []streamio.Record) error {
		first, found = recs[0], true
		return errFirst
	})
	if err != nil && !errors.Is(err, errFirst) {
		return streamio.Record{}, false, fmt.Errorf("replay: find the first record: %w", err)
	}
	return first, found, nil
}
