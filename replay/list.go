package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/keyset"
)

// RunRecord is one replay run, as `idem replay runs` lists it. Forensic
// replays write nothing and have no run.
type RunRecord struct {
	// ID is the run id; pass it as Options.RunID to resume the run.
	ID string
	// Mode is normal, rebuild or repair.
	Mode idem.Mode
	// Consumer and Stream are the replayed consumer and stream.
	Consumer, Stream string
	// From and To are the range as given (ParsePosition's forms).
	From, To string
	// End is the last offset of the range, fixed when the run started; -1
	// for an empty range.
	End int64
	// Handoff is where a finished rebuild moved the live consumer's
	// checkpoint; nil otherwise.
	Handoff *int64
	// Operator and Reason are a repair's audit fields.
	Operator, Reason string
	// Finished reports whether the run reached its end; an unfinished run
	// is running or was interrupted and can be resumed (or, an online
	// rebuild, abandoned).
	Finished bool
	// Abandoned reports an online rebuild given up with Abandon: its shadow
	// tables were dropped.
	Abandoned bool
	// Projection and Tables are an online rebuild's projection and tables;
	// empty otherwise.
	Projection string
	Tables     []string
	// StartedAt is when the run started; FinishedAt when it finished or was
	// abandoned (zero while unfinished).
	StartedAt, FinishedAt time.Time
	// Audited counts the audit rows the run wrote (repair: one per settled
	// selected message), kept on the run as it writes them, so they stay
	// counted after retention deletes the rows. DeadLettered counts the
	// messages the run dead-lettered: a repair's audit rows whose outcome
	// was dead_lettered, a rebuild's dead letters (written under its own
	// inbox scope, counted through the dead letters' consumer index).
	Audited, DeadLettered int64
}

// RunFilter selects runs for ListRuns; zero fields match everything.
type RunFilter struct {
	// Consumer keeps the runs of this consumer.
	Consumer string
	// Limit caps the runs returned, newest first. Default: 100.
	Limit int
}

// listRunsSQL reads a page of runs, newest first, through the index on
// (started_at, run_id) or, for one consumer, its own: the counts are the
// run's, kept as it writes its audit rows, so a page reads one row per run.
const listRunsSQL = `SELECT r.run_id, r.mode, r.consumer, r.stream, r.from_position, r.to_position, r.end_offset,
	r.handoff_offset, r.operator, r.reason, r.status = 'finished', r.status = 'abandoned',
	coalesce(r.projection, ''), coalesce(r.projection_tables, '{}'), r.started_at, r.finished_at,
	r.audited, r.dead_lettered
FROM %[1]s AS r`

// ListRuns returns the replay runs in tables matching f, newest first, with
// their audit counts.
func ListRuns(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, tables idem.Tables, f RunFilter) ([]RunRecord, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	tables = tables.WithDefaults()
	var w keyset.Where
	w.Equal("r.consumer", f.Consumer)
	sql := fmt.Sprintf(listRunsSQL, tables.Table("replay_runs")) + w.SQL() +
		" ORDER BY r.started_at DESC, r.run_id DESC LIMIT " + w.Arg(f.Limit)
	rows, err := q.Query(ctx, sql, w.Args...)
	if err != nil {
		return nil, fmt.Errorf("replay: list runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunRecord, error) {
		var (
			r        RunRecord
			mode     string
			finished *time.Time
		)
		err := row.Scan(&r.ID, &mode, &r.Consumer, &r.Stream, &r.From, &r.To, &r.End, &r.Handoff, &r.Operator,
			&r.Reason, &r.Finished, &r.Abandoned, &r.Projection, &r.Tables, &r.StartedAt, &finished, &r.Audited, &r.DeadLettered)
		r.Mode = idem.Mode(mode)
		if finished != nil {
			r.FinishedAt = *finished
		}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("replay: list runs: %w", err)
	}
	for i := range out {
		if out[i].Mode != idem.Rebuild {
			continue
		}
		if out[i].DeadLettered, err = deadletters.Count(ctx, q, tables, rebuildScope(out[i].Consumer, out[i].ID)); err != nil {
			return nil, fmt.Errorf("replay: list runs: %w", err)
		}
	}
	return out, nil
}
