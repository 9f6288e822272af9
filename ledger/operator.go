package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keyset"
	"github.com/idemkit/idem/internal/rowcount"
)

// listSQL reads a page of entries in (created_at, effect_id) order, under
// the conditions of the filter's set fields (keyset.Where), through the
// index that matches them: all, by status, by consumer (migration 0021).
const listSQL = `SELECT {columns} FROM {ledger}`

// statusCountSQL counts the entries in status $1, reading at most $2 of
// them through the status index.
const statusCountSQL = `SELECT count(*) FROM (SELECT 1 FROM {ledger} WHERE status = $1 LIMIT $2) AS capped`

// Filter selects entries for List and ResolveWhere.
type Filter struct {
	// Status keeps entries in this status; empty keeps all. ResolveWhere
	// requires it.
	Status Status
	// Type keeps entries of this effect type; empty keeps all.
	Type string
	// Consumer keeps entries recorded by this consumer; empty keeps all.
	Consumer string
	// MessageIDs keeps entries recorded while processing these messages
	// (with Consumer, to scope them); empty keeps all.
	MessageIDs []string
	// After continues a listing after the entry whose Cursor it is: pages
	// are in the order entries were recorded (created_at, then effect id),
	// and an entry recorded or changed meanwhile neither repeats nor shifts
	// the pages. Empty starts with the oldest.
	After string
	// Limit is the most entries returned (ResolveWhere: resolved per
	// page). Default: 100.
	Limit int
}

// Cursor returns the position of e in a listing, for Filter.After: the
// next page starts after e.
func (e Entry) Cursor() string { return keyset.Encode(e.CreatedAt, e.ID) }

// List returns a page of the entries matching f, oldest first: at most
// f.Limit, after f.After. When it returns f.Limit entries, the next page
// starts after the last one's Cursor.
func (l *Ledger) List(ctx context.Context, f Filter) ([]Entry, error) {
	return l.list(ctx, f, time.Time{})
}

// list is List of the entries recorded at or before end, when end is set.
func (l *Ledger) list(ctx context.Context, f Filter, end time.Time) ([]Entry, error) {
	if err := l.needPool(); err != nil {
		return nil, err
	}
	if f.Status != "" && !f.Status.Valid() {
		return nil, fmt.Errorf("ledger: list: unknown status %q", f.Status)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var w keyset.Where
	order := ""
	switch {
	case len(f.MessageIDs) > 0: // a few rows: the (consumer, message_id) index
		w.Equal("status", string(f.Status))
		w.Equal("consumer", f.Consumer)
		w.Add("message_id = ANY(" + w.Arg(f.MessageIDs) + "::text[])")
	case f.Status != "" && f.Consumer != "": // the (consumer, status, created_at, effect_id) index
		order = w.Leading("consumer", f.Consumer, false)
		order += w.Leading("status", string(f.Status), false)
	case f.Status != "": // the (status, created_at, effect_id) index
		order = w.Leading("status", string(f.Status), false)
		w.Equal("consumer", f.Consumer)
	default: // the (consumer, created_at, effect_id) index, or (created_at, effect_id)
		if f.Consumer != "" {
			order = w.Leading("consumer", f.Consumer, false)
		}
	}
	w.Equal("effect_type", f.Type)
	err := w.After(f.After, "created_at", "effect_id", "text", func(id string) (any, error) { return id, nil })
	if err != nil {
		return nil, fmt.Errorf("ledger: list: after %q: %w", f.After, err)
	}
	if !end.IsZero() {
		w.Add("created_at <= " + w.Arg(end) + "::timestamptz")
	}
	sql := l.sql.list + w.SQL() + " ORDER BY " + order + "created_at, effect_id LIMIT " + w.Arg(f.Limit)
	rows, err := l.pool.Query(ctx, sql, w.Args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: list: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	return out, nil
}

// Get returns the entry with effect id id, or an error matching ErrNotFound.
func (l *Ledger) Get(ctx context.Context, id string) (Entry, error) {
	if err := l.needPool(); err != nil {
		return Entry{}, err
	}
	e, err := scanEntry(l.pool.QueryRow(ctx, l.sql.get, id))
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: get %s: %w", id, notFound(id, err))
	}
	return e, nil
}

// Stats is a summary of the ledger.
type Stats struct {
	// Counts holds the number of effects in each status present. A status
	// with fewer than a thousand effects is counted exactly; one with more
	// is the planner's estimate (see Estimated), so Stats reads about as
	// many rows as it reports, however deep the history.
	Counts map[Status]int64
	// Estimated holds the statuses whose count is an estimate: the table's
	// statistics (its last ANALYZE, scaled to its size now) put them at a
	// thousand effects or more.
	Estimated map[Status]bool
	// OldestDue is how long the oldest due effect has waited for a
	// dispatcher; zero when none is due.
	OldestDue time.Duration
}

// Stats counts effects by status and measures the backlog.
func (l *Ledger) Stats(ctx context.Context) (Stats, error) {
	if err := l.needPool(); err != nil {
		return Stats{}, err
	}
	s := Stats{Counts: map[Status]int64{}, Estimated: map[Status]bool{}}
	planner, err := rowcount.ReadStats(ctx, l.pool, l.sql.table, "status")
	if err != nil {
		return Stats{}, fmt.Errorf("ledger: stats: %w", err)
	}
	for _, status := range Statuses() {
		c, err := planner.Of(ctx, string(status), func(ctx context.Context, limit int) (int64, error) {
			var n int64
			err := l.pool.QueryRow(ctx, l.sql.statusCount, string(status), limit).Scan(&n)
			return n, err
		})
		if err != nil {
			return Stats{}, fmt.Errorf("ledger: stats: count %s: %w", status, err)
		}
		if c.N > 0 {
			s.Counts[status] = c.N
			s.Estimated[status] = c.Estimated
		}
	}
	var oldest float64
	if err := l.pool.QueryRow(ctx, l.sql.gauges).Scan(nil, &oldest); err != nil {
		return Stats{}, fmt.Errorf("ledger: stats: %w", err)
	}
	s.OldestDue = time.Duration(oldest * float64(time.Second))
	return s, nil
}

func (l *Ledger) needPool() error {
	if l.pool == nil {
		return fmt.Errorf("ledger: %w: Config.Pool is required for operator functions", idem.ErrConfig)
	}
	return nil
}

const historySQL = `SELECT operator, from_status, to_status, reason, resolved_at FROM {audit}
WHERE effect_id = $1 ORDER BY resolved_at, id`

// AuditRecord is one operator decision about an effect.
type AuditRecord struct {
	// Operator is who decided.
	Operator string
	// From and To are the statuses before and after.
	From, To Status
	// Reason is why.
	Reason string
	// At is when.
	At time.Time
}

// History returns the operator decisions about the effect with id id,
// oldest first.
func (l *Ledger) History(ctx context.Context, id string) ([]AuditRecord, error) {
	if err := l.needPool(); err != nil {
		return nil, err
	}
	rows, err := l.pool.Query(ctx, l.sql.history, id)
	if err != nil {
		return nil, fmt.Errorf("ledger: history %s: %w", id, err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var (
			a        AuditRecord
			from, to string
		)
		if err := rows.Scan(&a.Operator, &from, &to, &a.Reason, &a.At); err != nil {
			return nil, fmt.Errorf("ledger: history %s: %w", id, err)
		}
		a.From, a.To = Status(from), Status(to)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: history %s: %w", id, err)
	}
	return out, nil
}
