package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
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
	// Audited counts the run's audit rows (repair: one per settled selected
	// message); DeadLettered those among them whose outcome was
	// dead_lettered.
	Audited, DeadLettered int64
}

// RunFilter selects runs for ListRuns; zero fields match everything.
type RunFilter struct {
	// Consumer keeps the runs of this consumer.
	Consumer string
	// Limit caps the runs returned, newest first. Default: 100.
	Limit int
}

const listRunsSQL = `SELECT r.run_id, r.mode, r.consumer, r.stream, r.from_position, r.to_position, r.end_offset,
	r.handoff_offset, r.operator, r.reason, r.status = 'finished', r.status = 'abandoned',
	coalesce(r.projection, ''), coalesce(r.projection_tables, '{}'), r.started_at, r.finished_at,
	coalesce(a.audited, 0), coalesce(a.dead_lettered, 0)
FROM %[1]s AS r
LEFT JOIN LATERAL (SELECT count(*) AS audited, count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered
	FROM %[2]s WHERE run_id = r.run_id) AS a ON true
WHERE $1 = '' OR r.consumer = $1
ORDER BY r.started_at DESC, r.run_id DESC
LIMIT $2`

// ListRuns returns the replay runs in tables matching f, newest first, with
// their audit counts.
func ListRuns(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, tables idem.Tables, f RunFilter) ([]RunRecord, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	tables = tables.WithDefaults()
	rows, err := q.Query(ctx, fmt.Sprintf(listRunsSQL, tables.Table("replay_runs"), tables.Table("replay_audit")), f.Consumer, f.Limit)
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
	return out, nil
}
