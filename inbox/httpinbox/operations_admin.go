package httpinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keyset"
)

// operationStates is every state, in the order of an operation's life.
var operationStates = [...]OperationState{OperationAccepted, OperationRunning, OperationSucceeded, OperationFailed, OperationUnknown}

// OperationStates returns every state, in the order of an operation's
// life, in a new slice the caller may change.
func OperationStates() []OperationState { return slices.Clone(operationStates[:]) }

// Valid reports whether s is one of OperationStates.
func (s OperationState) Valid() bool { return slices.Contains(operationStates[:], s) }

// Errors of the operator functions (Operations.Resolve).
var (
	// ErrOperationInFlight: a worker's transaction holds the operation
	// (it is starting or finishing it); wait for it.
	ErrOperationInFlight = errors.New("httpinbox: a worker's transaction holds the operation")
	// ErrOperationFollowsEffect: the operation follows a ledger effect,
	// whose outcome finishes it; resolve the effect (ledger.Ledger.Resolve,
	// `idem ledger resolve`) and the operation follows.
	ErrOperationFollowsEffect = errors.New("httpinbox: the operation follows a ledger effect")
	// ErrOperationResolved: an operator resolved the operation already; it
	// comes as a *ResolvedError saying who, when and how, and matches
	// ErrOperationState too. Another operator's Resolve gets it, and so
	// does a worker's Start or Finish that comes later, which changes
	// nothing.
	ErrOperationResolved = errors.New("httpinbox: an operator resolved the operation already")
)

// OperationFilter selects operations for Operations.List. Empty fields
// select all.
type OperationFilter struct {
	State  OperationState
	Tenant string
	Caller string
	// Kind is the Operation of the route that accepted it.
	Kind string
	// Limit is the most operations returned. Default: 100.
	Limit int
}

// OperationResolution is an operator's decision about an operation that
// waits: unknown, or accepted or running while its worker is gone.
type OperationResolution struct {
	// As is where the operation goes: OperationSucceeded (it happened) or
	// OperationFailed (it did not, and will not).
	As OperationState
	// Result is what the status document shows as result: any value that
	// encodes as JSON, or nil. Default: none for succeeded, the problem
	// document OPERATION_FAILED for failed, as for a failed ledger effect.
	Result any
	// Reason says why, for the audit trail. Required.
	Reason string
	// Operator says who decided. Required.
	Operator string
}

// OperationAudit is one operator decision about an operation.
type OperationAudit struct {
	Operator string
	From     OperationState
	To       OperationState
	Reason   string
	At       time.Time
}

// OperationStats is a summary of the operations.
type OperationStats struct {
	// Counts holds the number of operations in each state present, as
	// stored: one that follows a ledger effect moves when it is read
	// (OperationStatus, Get, List).
	Counts map[OperationState]int64
	// OldestInProgress is the age (from its acceptance) of the oldest
	// operation accepted or running, among those a worker moves (Start,
	// Finish); zero when there is none. Operations that follow a ledger
	// effect are left out: the ledger's own gauges measure their effects.
	OldestInProgress time.Duration
	// OldestUnknown is how long the oldest unknown operation a worker moves
	// has waited (since it became unknown) for a reconciler or an operator;
	// zero when there is none.
	OldestUnknown time.Duration
}

const (
	// listOperationsSQL reads operations in (created_at, operation_id)
	// order, under the conditions of the filter's set fields
	// (keyset.Where), through the index that matches them (migration 0021).
	listOperationsSQL = `SELECT ` + operationColumns + ` FROM {ops}`

	// lockOperationSQL fails at once (NOWAIT) when a worker's transaction
	// holds the operation.
	lockOperationSQL = `SELECT state, coalesce(follows, '') FROM {ops} WHERE operation_id = $1 FOR UPDATE NOWAIT`

	operationAuditSQL = `INSERT INTO {audit} (operation_id, operator, from_state, to_state, reason)
VALUES ($1, $2, $3, $4, $5)`

	operationHistorySQL = `SELECT operator, from_state, to_state, reason, at FROM {audit}
WHERE operation_id = $1 ORDER BY at, id`

	operationCountsSQL = `SELECT state, count(*) FROM {ops} GROUP BY state`

	// operationAgesSQL reads the two ages through the partial indexes on
	// unfinished and unknown operations, leaving out those that follow a
	// ledger effect (they move when read, and the ledger measures them).
	operationAgesSQL = `SELECT
	coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM {ops}
		WHERE state IN ('accepted', 'running') AND follows IS NULL)), 0)::float8,
	coalesce(extract(epoch FROM now() - (SELECT min(updated_at) FROM {ops}
		WHERE state = 'unknown' AND follows IS NULL)), 0)::float8`
)

// operationAdminSQL holds the operator statements for one set of tables,
// and the table's name, which names its operators' advisory locks.
type operationAdminSQL struct {
	list, lock, audit, history, counts, ages, table string
	turn                                            turnStatements
}

func newOperationAdminSQL(t idem.Tables) operationAdminSQL {
	r := strings.NewReplacer("{ops}", t.Table("http_operations"), "{audit}", t.Table("http_operations_audit"))
	return operationAdminSQL{list: r.Replace(listOperationsSQL), lock: r.Replace(lockOperationSQL),
		audit: r.Replace(operationAuditSQL), history: r.Replace(operationHistorySQL),
		counts: r.Replace(operationCountsSQL), ages: r.Replace(operationAgesSQL), table: t.Table("http_operations"),
		turn: newTurnStatements(t.Table("http_operations_audit"), "operation_id")}
}

// List returns the operations that match f, oldest first. Like Get, it
// first brings an unfinished operation that follows a ledger effect up to
// date with the effect (and stores the move); one that thereby left
// f.State is left out, so at most f.Limit are returned.
func (o *Operations) List(ctx context.Context, f OperationFilter) ([]Operation, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("httpinbox: list operations: unknown state %q", f.State)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var w keyset.Where
	w.Equal("state", string(f.State))
	w.Equal("tenant", f.Tenant)
	w.Equal("caller", f.Caller)
	w.Equal("kind", f.Kind)
	sql := o.admin.list + w.SQL() + " ORDER BY created_at, operation_id LIMIT " + w.Arg(f.Limit)
	rows, err := o.pool.Query(ctx, sql, w.Args...)
	if err != nil {
		return nil, fmt.Errorf("httpinbox: list operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return scanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("httpinbox: list operations: %w", err)
	}
	out := ops[:0]
	for _, stored := range ops {
		op, err := o.follow(ctx, stored)
		if err != nil {
			return nil, fmt.Errorf("httpinbox: list operations: operation %s: %w", stored.ID, err)
		}
		if f.State == "" || op.State == f.State {
			out = append(out, op)
		}
	}
	return out, nil
}

// History returns the operator decisions about operation id, oldest first.
func (o *Operations) History(ctx context.Context, id string) ([]OperationAudit, error) {
	if !validOperationID(id) {
		return nil, nil // no operation has it, so no decision is about it
	}
	rows, err := o.pool.Query(ctx, o.admin.history, id)
	if err != nil {
		return nil, fmt.Errorf("httpinbox: operation history %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OperationAudit, error) {
		var a OperationAudit
		err := row.Scan(&a.Operator, &a.From, &a.To, &a.Reason, &a.At)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("httpinbox: operation history %s: %w", id, err)
	}
	return out, nil
}

// Resolve applies r to operation id and writes an audit row (who, when,
// from which state to which, why) in the same transaction, and returns the
// operation as it now stands. It settles an operation that waits for
// someone: unknown, or accepted or running while the worker that should
// finish it is gone. The decision is final: a worker that comes later gets
// a *ResolvedError (ErrOperationResolved, ErrOperationState) from Start
// and from Finish, and nothing changes.
//
// Operators resolving one operation at once take turns: the first one's
// decision stands, and the others get a *ResolvedError that names it
// (ErrOperationResolved), as does anyone resolving it later. An operation
// a worker's transaction holds fails with ErrOperationInFlight; one a
// worker finished (succeeded or failed) with ErrOperationState; one that
// follows a ledger effect with ErrOperationFollowsEffect, naming the
// effect to resolve instead; an unknown id with ErrOperationNotFound.
func (o *Operations) Resolve(ctx context.Context, id string, r OperationResolution) (Operation, error) {
	res, err := r.result(id)
	if err != nil {
		return Operation{}, err
	}
	var out Operation
	err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		from, err := o.lockForOperator(ctx, tx, id)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, o.sql.finish, id, r.As, from, res); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, o.admin.audit, id, r.Operator, from, r.As, r.Reason); err != nil {
			return err
		}
		out, err = scanOperation(tx.QueryRow(ctx, o.sql.get, id))
		return err
	})
	if err != nil {
		return Operation{}, fmt.Errorf("httpinbox: resolve operation %s: %w", id, err)
	}
	return out, nil
}

// result checks r for operation id and returns the result to store.
func (r OperationResolution) result(id string) ([]byte, error) {
	switch {
	case !r.As.Final():
		return nil, fmt.Errorf("httpinbox: resolve operation %s: cannot resolve as %q (want succeeded or failed)", id, r.As)
	case strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.Operator) == "":
		return nil, fmt.Errorf("httpinbox: resolve operation %s: a reason and an operator are required", id)
	case !validOperationID(id):
		return nil, fmt.Errorf("httpinbox: resolve operation %q: %w", id, ErrOperationNotFound)
	case r.Result != nil:
		res, err := json.Marshal(r.Result)
		if err != nil {
			return nil, fmt.Errorf("httpinbox: resolve operation %s: encode the result: %w", id, err)
		}
		return res, nil
	case r.As == OperationFailed:
		return failedResult(), nil
	}
	return nil, nil
}

// lockForOperator takes operation id for an operator's decision in tx,
// after any other operator's, and returns the state it is in; it fails
// when the operation cannot be resolved now.
func (o *Operations) lockForOperator(ctx context.Context, tx pgx.Tx, id string) (OperationState, error) {
	rv := o.resolver(id)
	switch won, err := rv.turn(ctx, tx); {
	case err != nil:
		return "", err
	case won != nil:
		return "", won
	}
	var (
		from    OperationState
		follows string
	)
	err := tx.QueryRow(ctx, o.admin.lock, id).Scan(&from, &follows)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available: a worker, since operators take turns
		return "", ErrOperationInFlight
	case errors.Is(err, pgx.ErrNoRows):
		return "", ErrOperationNotFound
	case err != nil:
		return "", err
	case from.Final():
		return "", o.finished(ctx, tx, id, from)
	case follows != "":
		return "", fmt.Errorf("%w: resolve effect %s instead (idem ledger resolve %s), and the operation follows its outcome",
			ErrOperationFollowsEffect, follows, follows)
	}
	return from, nil
}

// finished explains why operation id, finished in state, cannot be
// resolved: the operator who resolved it, or its worker.
func (o *Operations) finished(ctx context.Context, tx pgx.Tx, id string, state OperationState) error {
	d, err := o.resolver(id).decision(ctx, tx, 0)
	switch {
	case err != nil:
		return err
	case d != nil:
		return d
	}
	return fmt.Errorf("%w: it is %s, and a finished operation never changes", ErrOperationState, state)
}

// resolver is operation id as operators resolve it.
func (o *Operations) resolver(id string) resolver {
	return newResolver(o.admin.turn, o.admin.table, id, id, ErrOperationResolved, ErrOperationState)
}

// Stats counts operations by state and measures what waits.
func (o *Operations) Stats(ctx context.Context) (OperationStats, error) {
	s := OperationStats{Counts: map[OperationState]int64{}}
	rows, err := o.pool.Query(ctx, o.admin.counts)
	if err != nil {
		return OperationStats{}, fmt.Errorf("httpinbox: operation stats: %w", err)
	}
	var (
		state OperationState
		n     int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		s.Counts[state] = n
		return nil
	}); err != nil {
		return OperationStats{}, fmt.Errorf("httpinbox: operation stats: %w", err)
	}
	s.OldestInProgress, s.OldestUnknown, err = o.ages(ctx)
	return s, err
}

// ages runs operationAgesSQL: the ages of the oldest operation in progress
// and of the oldest unknown one, for Stats and the gauges.
func (o *Operations) ages(ctx context.Context) (inProgress, unknown time.Duration, err error) {
	var a, b float64
	if err := o.pool.QueryRow(ctx, o.admin.ages).Scan(&a, &b); err != nil {
		return 0, 0, fmt.Errorf("httpinbox: operation ages: %w", err)
	}
	return seconds(a), seconds(b), nil
}
