package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/projection"
)

// Summary says what a replay did. Counts cover the messages this call
// settled; a resumed run counts from where it resumed.
type Summary struct {
	// RunID names the run; empty for forensic replays, which keep no run.
	RunID string
	// Mode is the replay mode.
	Mode idem.Mode
	// Stream is the replayed stream.
	Stream string
	// End is the last offset of the range, fixed when the run first
	// started; -1 when the stream was empty.
	End int64
	// First and Last are the first and last offsets replayed by this call;
	// -1 when it replayed nothing.
	First, Last int64
	// Messages counts the messages settled.
	Messages int64
	// Processed messages ran their handler and committed (forensic: the
	// handler succeeded; nothing committed).
	Processed int64
	// Duplicates were skipped: the inbox scope held them with the same hash.
	Duplicates int64
	// DeadLettered messages could not be processed: a dead-letter row holds
	// the reason (forensic: none is written).
	DeadLettered int64
	// Skipped messages were not selected by a repair.
	Skipped int64
	// Conflicts reused a processed message's id with another payload.
	Conflicts int64
	// Retried counts the messages of a forensic replay whose handler failed
	// and would be retried (other modes retry in place).
	Retried int64
	// InboxNew and InboxDuplicate are the forensic inbox states, in the
	// claim's decision names: the live consumer has not processed the
	// message (new), or has, with this payload (duplicate).
	InboxNew, InboxDuplicate int64
	// Forgotten counts the messages of a forensic replay that the inbox
	// holds no row for, at or below its horizon: retention may have deleted
	// the rows of processed messages there, so they are neither counted
	// processed nor not processed.
	Forgotten int64
	// Effects counts the effects a forensic replay captured.
	Effects int64
	// CaughtUp counts the messages of a rebuild past the live consumer's
	// checkpoint, processed as the live consumer would (effects dispatched).
	CaughtUp int64
	// Handoff is where a rebuild handed the projection to the live
	// consumer: it continues after this offset. An in-place rebuild moved
	// the live checkpoint here; an online rebuild swapped its tables in
	// when the live consumer was here. Valid when HasHandoff.
	Handoff int64
	// HasHandoff reports whether Handoff is set.
	HasHandoff bool
	// Swapped reports an online rebuild whose tables replaced the live ones
	// (at Handoff).
	Swapped bool
	// Pause is how long an online rebuild's swap held the live consumer's
	// batches: the final catch-up, the inbox hand-over and the table swap.
	Pause time.Duration
	// Redispatched counts the effects a repair sent again.
	Redispatched int
	// Resumed reports whether the run continued an interrupted one.
	Resumed bool
	// Elapsed is how long the call took.
	Elapsed time.Duration
}

// Findings reports whether a forensic replay found what an operator should
// look at: conflicts, handlers that failed, or dead letters.
func (s Summary) Findings() bool { return s.Conflicts > 0 || s.Retried > 0 || s.DeadLettered > 0 }

// runner is the state of one Run call.
type runner struct {
	eng    *engine.Engine
	ib     *inbox.Inbox // the consumer's inbox: its horizon, the rebuild's scope
	cfg    consumer.Config
	o      Options
	pool   *pgxpool.Pool
	tables idem.Tables
	env    *streamio.Env
	log    *slog.Logger
	row    *run // nil for forensic
	sum    Summary
	report *reporter
	proj   *projection.Projection // an online rebuild's projection; nil otherwise
	// forgotten is, in a forensic replay, the live consumer's horizon on
	// the stream (-1 for none).
	forgotten int64

	*tally // what progress shows: settled, first, last, end, phase, pause

	main, catchUp *segment // how messages are processed; see segments

	// seen, when set, receives the records read before they are processed
	// (the swap notes the ids of the messages it applies in its pause).
	seen func(recs []streamio.Record)
}

// errEnd stops a read that reached the run's fixed end.
var errEnd = errors.New("replay: end reached")

// Run replays opts.Stream (default: c's Config.Stream, the stream it reads
// live) through c's handler in opts.Mode, from opts.From to an end fixed
// when the run first starts, and returns when the end is reached. See the package
// documentation for what each mode does. A run interrupted by an error or a
// cancelled ctx resumes from its checkpoint when Run is called again with
// the same RunID (printed in the logs and kept in Summary.RunID).
//
// A forensic replay that finds conflicts, failed handlers or dead letters returns its
// Summary with an error wrapping ErrFindings.
func Run(ctx context.Context, c *consumer.Consumer, opts Options) (Summary, error) {
	started := time.Now()
	cfg := c.Config()
	eng, ok := c.Runtime().(*engine.Engine)
	switch {
	case !ok:
		return Summary{}, fmt.Errorf("replay: consumer %s has no runtime idem can drive (%T)", cfg.Name, c.Runtime())
	case cfg.Stream == "":
		return Summary{}, invalid("consumer %s reads no stream: a replay needs a consumer built with Config.Stream", cfg.Name)
	}
	o, err := opts.withDefaults(cfg)
	if err != nil {
		return Summary{}, err
	}
	if o.Mode == idem.Rebuild && o.Stream != cfg.Stream {
		return Summary{}, invalid("a rebuild hands off to the live consumer of %q, not %q", cfg.Stream, o.Stream)
	}
	env, err := streamio.Open(ctx, streamio.Config{URI: cfg.StreamURL, Logger: o.Logger})
	if err != nil {
		return Summary{}, fmt.Errorf("replay: %w", err)
	}
	defer env.Close()
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables})
	if err != nil {
		return Summary{}, fmt.Errorf("replay: %w", err)
	}
	r := &runner{
		eng: eng, ib: ib, cfg: cfg, o: o, pool: cfg.Pool, tables: cfg.Tables, env: env,
		log:  o.Logger.With("consumer", cfg.Name, "stream", o.Stream, "mode", string(o.Mode)),
		sum:  Summary{Mode: o.Mode, Stream: o.Stream, First: -1, Last: -1, End: -1},
		proj: o.Projection, tally: newTally(),
	}
	err = r.run(ctx)
	r.sum.Elapsed = time.Since(started)
	if err == nil && o.Mode == idem.Forensic && r.sum.Findings() {
		err = fmt.Errorf("%w: %d conflicts, %d failed, %d dead-lettered", ErrFindings,
			r.sum.Conflicts, r.sum.Retried, r.sum.DeadLettered)
	}
	return r.sum, err
}

func (r *runner) run(ctx context.Context) error {
	switch {
	case r.o.Mode == idem.Forensic:
		end, err := r.resolveEnd(ctx)
		if err != nil {
			return err
		}
		r.sum.End = end
		if r.forgotten, err = r.forgottenUpTo(ctx, r.pool); err != nil {
			return err
		}
		r.report = newReporter(r.o.Report)
		if err := r.readAll(ctx, r.o.From, end); err != nil {
			return err
		}
		return r.report.summary(r.sum)
	case r.proj != nil:
		return r.runOnline(ctx)
	case r.o.Mode == idem.Rebuild:
		lock, err := r.lockStream(ctx)
		if err != nil {
			return err
		}
		ctx, release := r.hold(ctx, lock)
		defer release()
		return r.runBounded(ctx)
	default:
		return r.runBounded(ctx)
	}
}

// hold ties ctx to lock: the returned context ends when the lock is lost;
// release stops that and releases the lock.
func (r *runner) hold(ctx context.Context, lock *pglock.Lock) (context.Context, func()) {
	ctx, stop := context.WithCancelCause(ctx)
	go func() { // owned: ends when ctx does, which release cancels
		select {
		case <-lock.Lost():
			stop(fmt.Errorf("replay: lost the lock %s; resume the run", lock.Key()))
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		stop(nil)
		if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("releasing a lock", "lock_key", lock.Key(), "error", err)
		}
	}
}

// runBounded runs a normal or repair replay, or an in-place rebuild, from
// its start (or checkpoint) to the end fixed when it first started.
func (r *runner) runBounded(ctx context.Context) error {
	from, err := r.start(ctx)
	if err != nil || r.row.status == "finished" {
		return err
	}
	r.sum.RunID, r.sum.End = r.row.id, r.row.end
	r.log = r.log.With("run_id", r.row.id)
	r.log.Info("replay started", "from", from.String(), "end", r.row.end, "resumed", r.sum.Resumed)
	if err := r.readAll(ctx, from, r.row.end); err != nil {
		return r.resumable(ctx, err)
	}
	return r.finish(ctx)
}

// resumable says how to resume after err, the error of a run that
// stopped midway; a lost lock is reported as the cause.
func (r *runner) resumable(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	return fmt.Errorf("%w (resume with run id %s)", err, r.row.id)
}

// resolveEnd fixes the last offset to read: the tail now, or the given
// offset if it comes first. A time end keeps the tail; records after the
// time are dropped while reading.
func (r *runner) resolveEnd(ctx context.Context) (int64, error) {
	tail, ok, err := r.env.Tail(ctx, r.o.Stream)
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	if !ok {
		return -1, nil
	}
	if r.o.To.kind() == streamio.PositionOffset {
		return min(tail, r.o.To.at()), nil
	}
	return tail, nil
}

// start registers a new run (running Reset for a rebuild) or loads the
// interrupted one, and returns where reading starts.
func (r *runner) start(ctx context.Context) (Position, error) {
	id := r.o.RunID
	if id != "" {
		row, err := r.getRun(ctx, id)
		if err != nil {
			return Position{}, err
		}
		if row != nil {
			return r.resume(ctx, row)
		}
	} else {
		id = newRunID(r.o.now())
	}
	if r.o.Mode == idem.Repair && r.o.Select.empty() {
		return Position{}, invalid("a repair needs a selection: business keys or message ids")
	}
	if r.o.Mode == idem.Repair && (strings.TrimSpace(r.o.Operator) == "" || strings.TrimSpace(r.o.Reason) == "") {
		return Position{}, invalid("a repair needs an operator and a reason for the audit")
	}
	end, err := r.resolveEnd(ctx)
	if err != nil {
		return Position{}, err
	}
	if err := r.checkHorizon(ctx, r.o.From, end); err != nil {
		return Position{}, err
	}
	row := &run{
		id: id, mode: string(r.o.Mode), consumer: r.cfg.Name, stream: r.o.Stream,
		from: r.o.From.String(), to: r.o.To.String(), end: end,
		keys: r.o.Select.Keys, ids: r.o.Select.IDs, redispatch: r.o.Redispatch,
		operator: r.o.Operator, reason: r.o.Reason, status: "running",
	}
	if r.o.Mode == idem.Rebuild {
		live, err := r.liveCheckpoint(ctx)
		if err != nil {
			return Position{}, err
		}
		if end >= 0 && live > end {
			return Position{}, invalid("the rebuild would end at offset %d, before the live consumer's checkpoint %d: "+
				"the live consumer would skip (%d, %d] as duplicates of its own inbox; rebuild to at least %d",
				end, live, end, live, live)
		}
		// The hand-off moves the live checkpoint to the end: a rebuild that
		// starts after the live checkpoint would leave the messages in
		// between processed by nobody.
		switch {
		case r.o.From.kind() == streamio.PositionTime:
			return Position{}, invalid("a rebuild starts from first or an offset, not a time: the live consumer's " +
				"messages before the start must all be covered")
		case r.o.From.kind() == streamio.PositionOffset && r.o.From.at() > live+1:
			return Position{}, invalid("the rebuild would start at offset %d, after the live consumer's checkpoint %d: "+
				"(%d, %d) would be processed by nobody; start at %d or earlier", r.o.From.at(), live, live, r.o.From.at(), live+1)
		}
		row.live = &live
	}
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := r.insertRun(ctx, tx, row); err != nil {
			return err
		}
		if r.o.Mode == idem.Rebuild {
			if err := r.holdScope(ctx, tx, row); err != nil {
				return err
			}
		}
		if r.o.Reset != nil {
			if err := r.o.Reset(ctx, tx); err != nil {
				return fmt.Errorf("replay: reset hook: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Position{}, err
	}
	r.row = row
	return r.o.From, nil
}

// resume continues the interrupted run row from its checkpoint.
func (r *runner) resume(ctx context.Context, row *run) (Position, error) {
	if row.mode != string(r.o.Mode) || row.consumer != r.cfg.Name || row.stream != r.o.Stream {
		return Position{}, fmt.Errorf("%w: run %s is a %s replay of %s by %s", ErrRunMismatch, row.id, row.mode, row.stream, row.consumer)
	}
	r.row = row
	r.sum.Resumed = true
	r.sum.RunID, r.sum.End = row.id, row.end
	if row.status == "finished" {
		if row.handoff != nil {
			r.sum.Handoff, r.sum.HasHandoff = *row.handoff, true
		}
		r.log.Info("replay run already finished", "run_id", row.id)
		return Position{}, nil
	}
	r.o.Select = Selection{Keys: row.keys, IDs: row.ids}
	r.o.Redispatch = row.redispatch
	r.o.Operator, r.o.Reason = row.operator, row.reason
	r.o.From, r.o.To = mustParse(row.from), mustParse(row.to)
	if r.o.To.kind() != streamio.PositionTime {
		r.o.To = Offset(row.end)
	}
	last, ok, err := store.Checkpoint(ctx, r.pool, r.tables, runScope(r.cfg.Name, row.id), row.stream)
	if err != nil {
		return Position{}, err
	}
	if row.live != nil {
		live, err := r.liveCheckpoint(ctx)
		if err != nil {
			return Position{}, err
		}
		// The catch-up past the live checkpoint advances both checkpoints in
		// the same transaction; anything else means a live worker ran.
		if live != *row.live && !(ok && live == last && live > *row.live) {
			return Position{}, fmt.Errorf("%w: its checkpoint was %d when run %s started and is %d now",
				ErrLiveMoved, *row.live, row.id, live)
		}
	}
	from := r.o.From
	if ok {
		from = Offset(last + 1)
	}
	if row.mode == string(idem.Rebuild) {
		return from, r.checkOwnScope(ctx, row)
	}
	// Retention may have moved the horizon while the run was stopped.
	return from, r.checkHorizon(ctx, from, row.end)
}

// mustParse reads a position stored by start.
func mustParse(s string) Position {
	p, err := ParsePosition(s)
	if err != nil {
		return Position{}
	}
	return p
}

// liveCheckpoint returns the live consumer's checkpoint, -1 for none.
func (r *runner) liveCheckpoint(ctx context.Context) (int64, error) {
	last, ok, err := store.Checkpoint(ctx, r.pool, r.tables, r.cfg.Name, r.o.Stream)
	if err != nil || !ok {
		return -1, err
	}
	return last, nil
}

// readAll replays [from, end] with the progress display.
func (r *runner) readAll(ctx context.Context, from Position, end int64) (err error) {
	r.end.Store(end)
	if r.o.Progress != nil && end >= 0 {
		prog := startProgress(r.o.Progress, r.o.ProgressInterval, string(r.o.Mode)+" "+r.o.Stream, from, r.tally)
		defer func() { prog.stop(err == nil) }()
	}
	return r.read(ctx, from, end)
}

// read replays [from, end] batch by batch.
func (r *runner) read(ctx context.Context, from Position, end int64) error {
	if end < 0 || from.kind() == streamio.PositionOffset && from.at() > end {
		return nil
	}
	to := Offset(end)
	if r.o.To.kind() == streamio.PositionTime {
		to = r.o.To
	}
	spec := streamio.ReadSpec{Stream: r.o.Stream, From: from.stream(), To: to.stream(), MaxBatch: r.o.BatchSize}
	err := r.env.Read(ctx, spec, func(ctx context.Context, recs []streamio.Record) error {
		n := len(recs)
		for n > 0 && recs[n-1].Offset > end {
			n--
		}
		if n > 0 && r.seen != nil {
			r.seen(recs[:n])
		}
		if n > 0 {
			if err := r.batch(ctx, recs[:n]); err != nil {
				return err
			}
		}
		if n < len(recs) || recs[len(recs)-1].Offset == end {
			return errEnd
		}
		return nil
	})
	if errors.Is(err, errEnd) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// finish ends a run: the rebuild's hand-off, the repair's re-dispatch, and
// the run's row, in one transaction where it matters.
func (r *runner) finish(ctx context.Context) error {
	if r.row.redispatch {
		n, err := r.redispatch(ctx)
		r.sum.Redispatched = n
		if err != nil {
			return err
		}
	}
	var handoff *int64
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if r.row.live != nil && r.row.end >= 0 {
			handoff = ptr(r.row.end)
			if err := store.MoveCheckpoint(ctx, tx, r.tables, r.cfg.Name, r.row.stream, r.row.end); err != nil {
				return err
			}
		}
		return r.finishRun(ctx, tx, handoff)
	})
	if err != nil {
		return err
	}
	if handoff != nil {
		r.sum.Handoff, r.sum.HasHandoff = *handoff, true
	}
	r.log.Info("replay finished", "messages", r.sum.Messages, "processed", r.sum.Processed,
		"duplicates", r.sum.Duplicates, "dead_lettered", r.sum.DeadLettered, "handoff", handoff)
	return nil
}

// redispatch sends the failed_terminal and unknown effects of the messages
// the repair re-ran again, through the ledger's audited resolution.
func (r *runner) redispatch(ctx context.Context) (int, error) {
	rows, err := r.pool.Query(ctx, fmt.Sprintf(rerunIDsSQL, r.tables.Table("replay_audit")), r.row.id)
	if err != nil {
		return 0, fmt.Errorf("replay: find re-run messages: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	l, err := ledger.New(ledger.Config{Pool: r.pool, Tables: r.tables})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, status := range []ledger.Status{ledger.StatusFailedTerminal, ledger.StatusUnknown} {
		entries, err := l.List(ctx, ledger.Filter{Status: status, Consumer: r.cfg.Name, MessageIDs: ids, Limit: 100000})
		if err != nil {
			return n, fmt.Errorf("replay: find effects to re-dispatch: %w", err)
		}
		for _, e := range entries {
			_, err := l.Resolve(ctx, e.ID, ledger.Resolution{As: ledger.StatusPending, Operator: r.row.operator,
				Reason: fmt.Sprintf("repair run %s: %s", r.row.id, r.row.reason)})
			if err != nil {
				return n, fmt.Errorf("replay: re-dispatch: %w", err)
			}
			n++
		}
	}
	return n, nil
}
