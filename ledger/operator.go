package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

const listSQL = `SELECT {columns} FROM {ledger}
WHERE ($1 = '' OR status = $1) AND ($2 = '' OR effect_type = $2) AND ($3 = '' OR consumer = $3)
	AND (cardinality($4::text[]) = 0 OR message_id = ANY($4::text[]))
ORDER BY created_at, effect_id
LIMIT $5`

const statsSQL = `SELECT status, count(*) FROM {ledger} GROUP BY status`

// resolveSQL moves effect $1 from status $2 to $3 for an operator.
const resolveSQL = `UPDATE {ledger} SET
	status = $3::text, lock_owner = NULL, locked_until = NULL, next_attempt_at = now(),
	attempt_count = CASE WHEN $3::text = 'pending' THEN 0 ELSE attempt_count END,
	last_error = $4,
	completed_at = CASE WHEN $3::text IN ('succeeded', 'failed_terminal') THEN now() END
WHERE effect_id = $1 AND status = $2
RETURNING {columns}`

const auditSQL = `INSERT INTO {audit} (effect_id, operator, from_status, to_status, reason)
VALUES ($1, $2, $3, $4, $5)`

// Filter selects entries for List.
type Filter struct {
	// Status keeps entries in this status; empty keeps all.
	Status Status
	// Type keeps entries of this effect type; empty keeps all.
	Type string
	// Consumer keeps entries recorded by this consumer; empty keeps all.
	Consumer string
	// MessageIDs keeps entries recorded while processing these messages
	// (with Consumer, to scope them); empty keeps all.
	MessageIDs []string
	// Limit is the most entries returned. Default: 100.
	Limit int
}

// List returns entries matching f, oldest first.
func (l *Ledger) List(ctx context.Context, f Filter) ([]Entry, error) {
	if err := l.needPool(); err != nil {
		return nil, err
	}
	if f.Status != "" && !f.Status.Valid() {
		return nil, fmt.Errorf("ledger: list: unknown status %q", f.Status)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	ids := f.MessageIDs
	if ids == nil {
		ids = []string{}
	}
	rows, err := l.pool.Query(ctx, l.sql.list, string(f.Status), f.Type, f.Consumer, ids, f.Limit)
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

// Resolution is an operator's decision about an effect, typically an unknown
// one after checking with the target.
type Resolution struct {
	// As is the new status: StatusSucceeded (it happened),
	// StatusFailedTerminal (it did not and must not be tried again) or
	// StatusPending (send it again, with the same idempotency key).
	As Status
	// Reason says why, for the audit trail. Required.
	Reason string
	// Operator says who decided. Required.
	Operator string
}

// Resolve applies r to the effect with id id and writes an audit row (who,
// when, from which status to which, why) in the same transaction. An effect
// in flight cannot be resolved (ErrInFlight): wait for its outcome or for its
// lease to expire. A succeeded or suppressed effect cannot be resolved
// (ErrNotResolvable). Resolving to StatusPending sends it again, with the
// same idempotency key and a fresh attempt budget, and wakes the dispatchers.
func (l *Ledger) Resolve(ctx context.Context, id string, r Resolution) (Entry, error) {
	if err := l.needPool(); err != nil {
		return Entry{}, err
	}
	switch r.As {
	case StatusSucceeded, StatusFailedTerminal, StatusPending:
	default:
		return Entry{}, fmt.Errorf("ledger: resolve %s: cannot resolve as %q (want succeeded, failed_terminal or pending)", id, r.As)
	}
	if strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.Operator) == "" {
		return Entry{}, fmt.Errorf("ledger: resolve %s: a reason and an operator are required", id)
	}
	var out Entry
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		cur, err := scanEntry(tx.QueryRow(ctx, l.sql.get+" FOR UPDATE", id))
		if err != nil {
			return notFound(id, err)
		}
		switch cur.Status {
		case StatusInFlight:
			return fmt.Errorf("%w until %s", ErrInFlight, cur.LockedUntil.Format(time.RFC3339))
		case StatusSucceeded, StatusSuppressed:
			// Sending a completed effect again, or a rebuild's suppressed one,
			// is never an operator's fix.
			return fmt.Errorf("%w: %s is %s", ErrNotResolvable, id, cur.Status)
		}
		note := fmt.Sprintf("resolved as %s by %s: %s", r.As, r.Operator, r.Reason)
		out, err = scanEntry(tx.QueryRow(ctx, l.sql.resolve, id, string(cur.Status), string(r.As), note))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, l.sql.audit, id, r.Operator, string(cur.Status), string(r.As), r.Reason); err != nil {
			return err
		}
		if r.As == StatusPending {
			_, err = tx.Exec(ctx, "SELECT pg_notify($1, '')", l.sql.channel)
		}
		return err
	})
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: resolve %s: %w", id, err)
	}
	return out, nil
}

// Stats is a summary of the ledger.
type Stats struct {
	// Counts holds the number of effects in each status present.
	Counts map[Status]int64
	// OldestDue is how long the oldest due effect has waited for a
	// dispatcher; zero when none is due.
	OldestDue time.Duration
}

// Stats counts effects by status and measures the backlog.
func (l *Ledger) Stats(ctx context.Context) (Stats, error) {
	if err := l.needPool(); err != nil {
		return Stats{}, err
	}
	s := Stats{Counts: map[Status]int64{}}
	rows, err := l.pool.Query(ctx, l.sql.stats)
	if err != nil {
		return Stats{}, fmt.Errorf("ledger: stats: %w", err)
	}
	for rows.Next() {
		var (
			status string
			n      int64
		)
		if err := rows.Scan(&status, &n); err != nil {
			rows.Close()
			return Stats{}, fmt.Errorf("ledger: stats: %w", err)
		}
		s.Counts[Status(status)] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("ledger: stats: %w", err)
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
		return errors.New("ledger: Config.Pool is required for operator functions")
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
