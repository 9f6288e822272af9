package httpinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// OperationStates lists every state, in the order of an operation's life.
var OperationStates = []OperationState{OperationAccepted, OperationRunning, OperationSucceeded, OperationFailed, OperationUnknown}

// Valid reports whether s is one of OperationStates.
func (s OperationState) Valid() bool {
	for _, v := range OperationStates {
		if s == v {
			return true
		}
	}
	return false
}

// Errors of the operator functions (Operations.Resolve).
var (
	// ErrOperationInFlight: a worker's transaction holds the operation
	// (it is starting or finishing it); wait for it.
	ErrOperationInFlight = errors.New("httpinbox: a worker's transaction holds the operation")
	// ErrOperationFollowsEffect: the operation follows a ledger effect,
	// whose outcome finishes it; resolve the effect (ledger.Ledger.Resolve,
	// `idem ledger resolve`) and the operation follows.
	ErrOperationFollowsEffect = errors.New("httpinbox: the operation follows a ledger effect")
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
	listOperationsSQL = `SELECT ` + operationColumns + ` FROM {ops}
WHERE ($1 = '' OR state = $1) AND ($2 = '' OR tenant = $2) AND ($3 = '' OR caller = $3) AND ($4 = '' OR kind = $4)
ORDER BY created_at, operation_id
LIMIT $5`

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

// operationAdminSQL holds the operator statements for one set of tables.
type operationAdminSQL struct{ list, lock, audit, history, counts, ages string }

func newOperationAdminSQL(t idem.Tables) operationAdminSQL {
	r := strings.NewReplacer("{ops}", t.Table("http_operations"), "{audit}", t.Table("http_operations_audit"))
	return operationAdminSQL{list: r.Replace(listOperationsSQL), lock: r.Replace(lockOperationSQL),
		audit: r.Replace(operationAuditSQL), history: r.Replace(operationHistorySQL),
		counts: r.Replace(operationCountsSQL), ages: r.Replace(operationAgesSQL)}
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
	rows, err := o.pool.Query(ctx, o.admin.list, string(f.State), f.Tenant, f.Caller, f.Kind, f.Limit)
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
// ErrOperationState from Start and from Finish into another state.
//
// An operation a worker's transaction holds fails with
// ErrOperationInFlight; a finished one (succeeded or failed) with
// ErrOperationState; one that follows a ledger effect with
// ErrOperationFollowsEffect, naming the effect to resolve instead; an
// unknown id with ErrOperationNotFound.
func (o *Operations) Resolve(ctx context.Context, id string, r OperationResolution) (Operation, error) {
	if !r.As.Final() {
		return Operation{}, fmt.Errorf("httpinbox: resolve operation %s: cannot resolve as %q (want succeeded or failed)", id, r.As)
	}
	if strings.TrimSpace(r.Reason) == "" || strings.TrimSpace(r.Operator) == "" {
		return Operation{}, fmt.Errorf("httpinbox: resolve operation %s: a reason and an operator are required", id)
	}
	var res []byte
	switch {
	case r.Result != nil:
		var err error
		if res, err = json.Marshal(r.Result); err != nil {
			return Operation{}, fmt.Errorf("httpinbox: resolve operation %s: encode the result: %w", id, err)
		}
	case r.As == OperationFailed:
		res = failedResult()
	}
	var out Operation
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var (
			from    OperationState
			follows string
		)
		err := tx.QueryRow(ctx, o.admin.lock, id).Scan(&from, &follows)
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available
			return ErrOperationInFlight
		case errors.Is(err, pgx.ErrNoRows):
			return ErrOperationNotFound
		case err != nil:
			return err
		case from.Final():
			return fmt.Errorf("%w: it is %s, and a finished operation never changes", ErrOperationState, from)
		case follows != "":
			return fmt.Errorf("%w: resolve effect %s instead (idem ledger resolve %s), and the operation follows its outcome",
				ErrOperationFollowsEffect, follows, follows)
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
