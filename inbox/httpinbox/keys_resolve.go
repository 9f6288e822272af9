package httpinbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/keyset"
)

// Resolve applies r to the record keyID and writes an audit row (who, when,
// from which state to which, why) in the same transaction. An unknown
// outcome may be confirmed (KeyCompleted) or handed back (KeyStarted); a
// started key may be handed back. A record a handler's transaction holds
// fails with ErrKeyInFlight; a stored completed or failed_replayable
// response, or another move, fails with ErrKeyNotResolvable.
//
// Operators resolving one key at once take turns: the first one's decision
// stands, and the others get a *ResolvedError that names it
// (ErrKeyResolved), as does anyone asking later for a move that decision
// ruled out.
func (k *Keys) Resolve(ctx context.Context, keyID string, r KeyResolution) (KeyRecord, error) {
	if err := r.check(keyID); err != nil {
		return KeyRecord{}, err
	}
	res, err := k.resolveOne(ctx, keyID, r)
	if err != nil {
		return KeyRecord{}, err
	}
	return res.Record, res.Err
}

// check validates r for the key or filter named what.
func (r KeyResolution) check(what string) error {
	if r.As != KeyCompleted && r.As != KeyStarted {
		return fmt.Errorf("httpinbox: resolve key %s: cannot resolve as %q (want completed or started)", what, r.As)
	}
	if strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.Operator) == "" {
		return fmt.Errorf("httpinbox: resolve key %s: a reason and an operator are required", what)
	}
	if r.From != "" && !resolvable(r.From, r.As) {
		return fmt.Errorf("httpinbox: resolve key %s: %w: a %s key can only become %s", what, ErrKeyNotResolvable,
			r.From, resolutionsOf(r.From))
	}
	return nil
}

// resolveOne resolves keyID as r says, in a transaction of its own. A
// refusal is the result's Err; the error is for anything else.
func (k *Keys) resolveOne(ctx context.Context, keyID string, r KeyResolution) (KeyResolveResult, error) {
	res := KeyResolveResult{KeyID: keyID}
	id, err := parseKeyID(keyID)
	if err != nil {
		res.Err = fmt.Errorf("httpinbox: resolve key: %w", err)
		return res, nil
	}
	err = pgx.BeginFunc(ctx, k.pool, func(tx pgx.Tx) error {
		rv := newResolver(k.sql.turn, k.sql.table, id, keyID, ErrKeyResolved, ErrKeyNotResolvable)
		from, err := k.lockForOperator(ctx, tx, rv, r, &res.From)
		if err != nil {
			return err
		}
		if res.Record, err = scanKey(tx.QueryRow(ctx, k.sql.resolve, id, from, r.As)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, k.sql.audit, id, r.Operator, from, r.As, r.Reason)
		return err
	})
	if err == nil {
		return res, nil
	}
	err = fmt.Errorf("httpinbox: resolve key %s: %w", keyID, err)
	if errors.Is(err, ErrKeyNotFound) || errors.Is(err, ErrKeyInFlight) || errors.Is(err, ErrKeyNotResolvable) {
		res.Record, res.Err = KeyRecord{}, err
		return res, nil
	}
	return res, err
}

// lockForOperator takes the record of rv for an operator's move r in tx,
// after any other operator's, and returns the state it is in (also in
// *seen, once read); it fails when the record cannot move so now.
func (k *Keys) lockForOperator(ctx context.Context, tx pgx.Tx, rv resolver, r KeyResolution, seen *KeyState) (KeyState, error) {
	switch won, err := rv.turn(ctx, tx); {
	case err != nil:
		return "", err
	case won != nil:
		return "", won
	}
	var from KeyState
	err := tx.QueryRow(ctx, k.sql.lock, rv.id).Scan(&from)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available: a request, since operators take turns
		return "", ErrKeyInFlight
	case err != nil:
		return "", keyNotFound(err)
	}
	*seen = from
	if resolvable(from, r.As) && (r.From == "" || from == r.From) {
		return from, nil
	}
	// The decision that brought the record where it is, if an operator's.
	d, err := rv.decision(ctx, tx, 0)
	switch {
	case err != nil:
		return "", err
	case d != nil && d.To == string(from):
		return "", d
	case r.From != "" && from != r.From:
		return "", fmt.Errorf("%w: it is %s now, no longer %s", ErrKeyNotResolvable, from, r.From)
	}
	return "", fmt.Errorf("%w: it is %s, and %s can only become %s", ErrKeyNotResolvable, from, from, resolutionsOf(from))
}

// resolvable reports whether an operator may move a record from one state
// to another.
func resolvable(from, to KeyState) bool {
	return from == KeyUnknown || (from == KeyStarted && to == KeyStarted)
}

// resolutionsOf says where a record in state s may be resolved to.
func resolutionsOf(s KeyState) string {
	switch s {
	case KeyUnknown:
		return "completed or started"
	case KeyStarted:
		return "started (handed back)"
	}
	return "nothing: its response is stored"
}

// KeyResolveResult is what Keys.ResolveMany or Keys.ResolveWhere did with
// one record.
type KeyResolveResult struct {
	// KeyID is the record's id.
	KeyID string
	// From is the state the record was in when its turn came; "" when it
	// was not found.
	From KeyState
	// Record is the record as the resolution left it; zero when refused.
	Record KeyRecord
	// Err says why the record was refused, nil when it was resolved: it
	// matches ErrKeyNotFound, ErrKeyInFlight (a request holds it) or
	// ErrKeyNotResolvable (a stored response, a record no longer in
	// KeyResolution.From, or another operator's decision: a
	// *ResolvedError, matching ErrKeyResolved too).
	Err error
}

// Resolved reports whether the record was resolved.
func (r KeyResolveResult) Resolved() bool { return r.Err == nil }

// ResolveMany applies r to each record of keyIDs, in their order (an id
// given twice counts once), as Resolve does: each in a transaction of its
// own, taking its turn among operators, with its own guarded update and
// audit row, so that one refusal leaves the others resolved. It returns a
// result per id. The error is for what stops the whole run (an invalid r,
// the context, the database); the results before it stand.
func (k *Keys) ResolveMany(ctx context.Context, keyIDs []string, r KeyResolution) ([]KeyResolveResult, error) {
	if err := r.check(fmt.Sprintf("(%d keys)", len(keyIDs))); err != nil {
		return nil, err
	}
	out := make([]KeyResolveResult, 0, len(keyIDs))
	seen := make(map[string]bool, len(keyIDs))
	for _, id := range keyIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		res, err := k.resolveOne(ctx, id, r)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// ResolveWhere applies r to every record f selects, as ResolveMany does,
// one page of f.Limit records at a time (keyset pagination, so memory and
// each statement stay bounded), and hands each result to report as it
// goes. It requires f.State, and only resolves a record still in that
// state when its turn comes (KeyResolution.From), nor one created after
// ResolveWhere started: it never touches more than it lists. The error is
// for what stops the run; the results reported before it stand.
func (k *Keys) ResolveWhere(ctx context.Context, f KeyFilter, r KeyResolution, report func(KeyResolveResult)) error {
	if f.State == "" {
		return fmt.Errorf("httpinbox: resolve keys: a state is required: ResolveWhere never resolves every key")
	}
	if r.From != "" && r.From != f.State {
		return fmt.Errorf("httpinbox: resolve keys: KeyResolution.From %q differs from the filter's state %q", r.From, f.State)
	}
	r.From = f.State
	if err := r.check("(keys " + string(f.State) + ")"); err != nil {
		return err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var end time.Time
	if err := k.pool.QueryRow(ctx, "SELECT now()").Scan(&end); err != nil {
		return fmt.Errorf("httpinbox: resolve keys: %w", err)
	}
	return keyset.Walk(f.Limit, func(after string) ([]KeyRecord, error) {
		f.After = after
		return k.list(ctx, f, end)
	}, KeyRecord.Cursor, func(rec KeyRecord) error {
		res, err := k.resolveOne(ctx, rec.KeyID, r)
		if err == nil && report != nil {
			report(res)
		}
		return err
	})
}
