package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/keyset"
)

// resolveSQL moves effect $1 from status $2 to $3 for an operator.
const resolveSQL = `UPDATE {ledger} SET
	status = $3::text, lock_owner = NULL, locked_until = NULL, next_attempt_at = now(),
	attempt_count = CASE WHEN $3::text = 'pending' THEN 0 ELSE attempt_count END,
	maybe_sent = CASE WHEN $3::text = 'pending' THEN false ELSE maybe_sent END,
	last_error = $4,
	completed_at = CASE WHEN $3::text IN ('succeeded', 'failed_terminal') THEN now() END
WHERE effect_id = $1 AND status = $2
RETURNING {columns}`

const auditSQL = `INSERT INTO {audit} (effect_id, operator, from_status, to_status, reason)
VALUES ($1, $2, $3, $4, $5)`

// operatorLockSQL bounds the lock waits of a resolution's transaction.
const operatorLockSQL = `SELECT set_config('lock_timeout', $1, true)`

// operatorWait bounds how long a resolution waits for a transaction that
// holds its effect (a dispatcher writing an outcome takes milliseconds).
const operatorWait = 15 * time.Second

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
	// From, when set, is the status the operator saw the effect in: an
	// effect that has moved on since (a dispatcher, a reconciler or another
	// operator changed it) is refused with ErrNotResolvable rather than
	// resolved on what the operator no longer sees. ResolveWhere sets it
	// to its filter's status.
	From Status
}

// check validates r for the effect or filter named what.
func (r Resolution) check(what string) error {
	switch r.As {
	case StatusSucceeded, StatusFailedTerminal, StatusPending:
	default:
		return fmt.Errorf("ledger: resolve %s: cannot resolve as %q (want succeeded, failed_terminal or pending)", what, r.As)
	}
	if strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.Operator) == "" {
		return fmt.Errorf("ledger: resolve %s: a reason and an operator are required", what)
	}
	if r.From != "" && !resolvableFrom(r.From) {
		return fmt.Errorf("ledger: resolve %s: %w: an effect %s cannot be resolved", what, ErrNotResolvable, r.From)
	}
	return nil
}

// resolvableFrom reports whether an operator may resolve an effect in
// status s: not while a dispatcher holds it, and never once it succeeded
// or was suppressed (sending it again is never an operator's fix).
func resolvableFrom(s Status) bool {
	return s != StatusInFlight && s != StatusSucceeded && s != StatusSuppressed
}

// ResolveResult is what ResolveMany or ResolveWhere did with one effect.
type ResolveResult struct {
	// ID is the effect id.
	ID string
	// From is the status the effect was in when its turn came; "" when it
	// was not found.
	From Status
	// Entry is the effect as the resolution left it; zero when refused.
	Entry Entry
	// Err says why the effect was refused, nil when it was resolved: it
	// matches ErrNotFound, ErrInFlight (a dispatcher holds it) or
	// ErrNotResolvable (succeeded, suppressed, or no longer in
	// Resolution.From).
	Err error
}

// Resolved reports whether the effect was resolved.
func (r ResolveResult) Resolved() bool { return r.Err == nil }

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
	if err := r.check(id); err != nil {
		return Entry{}, err
	}
	res, err := l.resolveOne(ctx, id, r)
	if err != nil {
		return Entry{}, err
	}
	return res.Entry, res.Err
}

// ResolveMany applies r to each effect of ids, in their order (an id given
// twice counts once), as Resolve does: each in a transaction of its own,
// with its own guarded update and audit row, so that one refusal leaves the
// others resolved. It returns a result per id. The error is for what stops
// the whole run (an invalid r, the context, the database); the results
// before it stand.
func (l *Ledger) ResolveMany(ctx context.Context, ids []string, r Resolution) ([]ResolveResult, error) {
	if err := l.needPool(); err != nil {
		return nil, err
	}
	if err := r.check(fmt.Sprintf("%d effects", len(ids))); err != nil {
		return nil, err
	}
	out := make([]ResolveResult, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		res, err := l.resolveOne(ctx, id, r)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// ResolveWhere applies r to every effect f selects, as ResolveMany does,
// one page of f.Limit effects at a time (keyset pagination, so memory and
// each statement stay bounded), and hands each result to report as it
// goes. It requires f.Status, and only resolves an effect still in that
// status when its turn comes (Resolution.From), nor one recorded after
// ResolveWhere started: it never touches more than it lists. The error is
// for what stops the run; the results reported before it stand.
func (l *Ledger) ResolveWhere(ctx context.Context, f Filter, r Resolution, report func(ResolveResult)) error {
	if err := l.needPool(); err != nil {
		return err
	}
	if f.Status == "" {
		return fmt.Errorf("ledger: resolve where: a status is required: ResolveWhere never resolves every effect")
	}
	if r.From != "" && r.From != f.Status {
		return fmt.Errorf("ledger: resolve where: Resolution.From %q differs from the filter's status %q", r.From, f.Status)
	}
	r.From = f.Status
	if err := r.check("effects " + string(f.Status)); err != nil {
		return err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var end time.Time
	if err := l.pool.QueryRow(ctx, "SELECT now()").Scan(&end); err != nil {
		return fmt.Errorf("ledger: resolve where: %w", err)
	}
	return keyset.Walk(f.Limit, func(after string) ([]Entry, error) {
		f.After = after
		return l.list(ctx, f, end)
	}, Entry.Cursor, func(e Entry) error {
		res, err := l.resolveOne(ctx, e.ID, r)
		if err == nil && report != nil {
			report(res)
		}
		return err
	})
}

// resolveOne resolves effect id as r says, in a transaction of its own.
// A refusal is the result's Err; the error is for anything else.
func (l *Ledger) resolveOne(ctx context.Context, id string, r Resolution) (ResolveResult, error) {
	res := ResolveResult{ID: id}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		cur, err := l.lockForOperator(ctx, tx, id)
		if err != nil {
			return err
		}
		res.From = cur.Status
		switch {
		case cur.Status == StatusInFlight:
			return fmt.Errorf("%w until %s", ErrInFlight, cur.LockedUntil.Format(time.RFC3339))
		case !resolvableFrom(cur.Status):
			// Sending a completed effect again, or a rebuild's suppressed one,
			// is never an operator's fix.
			return fmt.Errorf("%w: %s is %s", ErrNotResolvable, id, cur.Status)
		case r.From != "" && cur.Status != r.From:
			return fmt.Errorf("%w: %s is %s now, no longer %s", ErrNotResolvable, id, cur.Status, r.From)
		}
		note := fmt.Sprintf("resolved as %s by %s: %s", r.As, r.Operator, r.Reason)
		if res.Entry, err = scanEntry(tx.QueryRow(ctx, l.sql.resolve, id, string(cur.Status), string(r.As), note)); err != nil {
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
	if err == nil {
		return res, nil
	}
	err = fmt.Errorf("ledger: resolve %s: %w", id, err)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrInFlight) || errors.Is(err, ErrNotResolvable) {
		res.Entry, res.Err = Entry{}, err
		return res, nil
	}
	return res, err
}

// lockForOperator locks effect id in tx and returns it, waiting at most
// operatorWait for a transaction that holds it (ErrInFlight after that).
func (l *Ledger) lockForOperator(ctx context.Context, tx pgx.Tx, id string) (Entry, error) {
	var cur Entry
	batch := &pgx.Batch{}
	batch.Queue(operatorLockSQL, strconv.FormatInt(operatorWait.Milliseconds(), 10)+"ms")
	batch.Queue(l.sql.get+" FOR UPDATE", id).QueryRow(func(row pgx.Row) error {
		var err error
		cur, err = scanEntry(row)
		return err
	})
	err := tx.SendBatch(ctx, batch).Close()
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available
		return Entry{}, fmt.Errorf("%w: a transaction has held it for over %s; try again", ErrInFlight, operatorWait)
	case err != nil:
		return Entry{}, notFound(id, err)
	}
	return cur, nil
}
