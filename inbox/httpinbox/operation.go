package httpinbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ledger"
)

// OperationState is where a long-running operation stands.
type OperationState string

// The states of an operation: accepted → running → succeeded | failed |
// unknown. Succeeded and failed are final; unknown waits for whoever can
// tell (a reconciler, an operator) and may still become either.
//
// Running is optional: work that finishes at once need not be started, so
// an accepted operation may go straight to succeeded, failed or unknown
// (Operations.Finish). A finished operation never changes. Start moves only
// an accepted one, so an operation moved by hand never goes back to
// running; one that follows a ledger effect goes from unknown back to
// running when the effect is sent again.
const (
	OperationAccepted  OperationState = "accepted"
	OperationRunning   OperationState = "running"
	OperationSucceeded OperationState = "succeeded"
	OperationFailed    OperationState = "failed"
	OperationUnknown   OperationState = "unknown"
)

// Final reports whether s is succeeded or failed.
func (s OperationState) Final() bool { return s == OperationSucceeded || s == OperationFailed }

// Errors of the operation records.
var (
	// ErrOperationNotFound: no operation has this id (for the caller who
	// asks).
	ErrOperationNotFound = errors.New("httpinbox: no such operation")
	// ErrOperationState: the operation cannot move where it was asked to
	// from where it stands (a finished operation never changes).
	ErrOperationState = errors.New("httpinbox: the operation cannot move so")
	// ErrOperationConflict: Accept found the id taken by an operation of
	// another scope or kind.
	ErrOperationConflict = errors.New("httpinbox: the operation id belongs to another operation")
)

// CodeOperationNotFound (404) answers a status request for an operation that
// does not exist, that another tenant or caller accepted, or whose id no
// operation can have (see Accepted.ID).
const CodeOperationNotFound = "OPERATION_NOT_FOUND"

// Operation is the record of a long-running operation.
type Operation struct {
	// ID names the operation; Kind is the Operation of the route that
	// accepted it.
	ID, Kind string
	// Tenant and Caller are the scope of the request that accepted it;
	// only they can read its status.
	Tenant, Caller string
	// State is where it stands.
	State OperationState
	// Follows is the ledger effect whose outcome finishes it, if any.
	Follows string
	// Location is where its status is read.
	Location string
	// Fields are the application's members of the status document (a JSON
	// object); Result is what it finished with, or nil.
	Fields, Result json.RawMessage
	// CreatedAt is when it was accepted, UpdatedAt when it last moved,
	// FinishedAt when it succeeded or failed (zero before), ExpiresAt when
	// cleanup may delete it once finished.
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
	ExpiresAt  time.Time
}

// Accepted is what a handler accepts to carry out later: Accept records it.
type Accepted struct {
	// ID names the operation: unique, and stable across every run of the
	// request's key, so that a handler run again (after a crash, or after
	// the key expired) finds the same operation; 1 to 255 bytes of UTF-8
	// without control characters or '/', and not "." or "..". Default:
	// "op_" and the first 24 hex digits of the request's KeyID.
	ID string
	// Location is where the operation's status is read, sent as the
	// Location header. Default: "/operations/" + ID, escaped as a path
	// segment.
	Location string
	// Fields are members added to the status document, such as the id of
	// the resource being built: a value that encodes as a JSON object
	// without operationId, state or result members, or nil.
	Fields any
	// Follows names a ledger effect (its effect id) whose outcome finishes
	// the operation: running while the effect waits or is retried,
	// succeeded (with the effect's response as result, when it is JSON),
	// failed or unknown as the effect ends. The effect may be recorded
	// later, by another process. Default: none; Operations.Start and
	// Operations.Finish move the operation.
	Follows string
}

// operationColumns are read by scanOperation.
const operationColumns = `operation_id, kind, tenant, caller, state, coalesce(follows, ''), location, fields, result,
	created_at, updated_at, finished_at, expires_at`

const (
	acceptOperationSQL = `INSERT INTO {ops}
	(operation_id, tenant, caller, kind, key_id, follows, location, fields, expires_at)
VALUES ($1, $2, $3, $4, $5, nullif($6, ''), $7, $8, now() + $9 * interval '1 microsecond')
ON CONFLICT (operation_id) DO NOTHING
RETURNING ` + operationColumns

	getOperationSQL = `SELECT ` + operationColumns + ` FROM {ops} WHERE operation_id = $1`

	startOperationSQL = `UPDATE {ops} SET state = 'running', updated_at = now()
WHERE operation_id = $1 AND state = 'accepted'`

	// finishOperationSQL moves an unfinished operation ($3 guards the state
	// it was read in, or any unfinished one when empty). A finished one is
	// kept as long after finishing as it was kept when accepted. updated_at
	// is when it last changed state: an unknown one finished unknown again
	// keeps how long it has waited.
	finishOperationSQL = `UPDATE {ops} SET state = $2, result = $4,
	updated_at = CASE WHEN state = $2 THEN updated_at ELSE now() END,
	finished_at = CASE WHEN $2 IN ('succeeded', 'failed') THEN now() END,
	expires_at = CASE WHEN $2 IN ('succeeded', 'failed') THEN greatest(expires_at, now() + (expires_at - created_at))
		ELSE expires_at END
WHERE operation_id = $1 AND state IN ('accepted', 'running', 'unknown') AND ($3 = '' OR state = $3)`

	// cleanupOperationsSQL deletes, like the keys' cleanup, up to $3
	// finished operations that expired by $1, walking their expiry index
	// from $2, and returns how many it deleted and the newest expiry.
	cleanupOperationsSQL = `WITH doomed AS (
	SELECT ctid FROM {ops}
	WHERE expires_at >= $2 AND expires_at <= $1 AND state IN ('succeeded', 'failed')
	ORDER BY expires_at LIMIT $3
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {ops} WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING expires_at
)
SELECT count(*), coalesce(max(expires_at), $2) FROM gone`
)

type operationSQL struct{ accept, get, start, finish, cleanup string }

func newOperationSQL(t idem.Tables) operationSQL {
	r := strings.NewReplacer("{ops}", t.Table("http_operations"))
	return operationSQL{accept: r.Replace(acceptOperationSQL), get: r.Replace(getOperationSQL),
		start: r.Replace(startOperationSQL), finish: r.Replace(finishOperationSQL), cleanup: r.Replace(cleanupOperationsSQL)}
}

// Operations moves and reads operation records outside the HTTP edge,
// typically in the worker that carries an operation out, in its own
// transaction: Start when the work begins, Finish with its outcome. It is
// also the operator's view of them: List, Get, History, Resolve and Stats
// (the `idem operations` command is built on them). It is safe for
// concurrent use.
type Operations struct {
	pool   *pgxpool.Pool
	sql    operationSQL
	admin  operationAdminSQL // the operator's statements (operations_admin.go)
	ledger *ledger.Ledger    // reads the effects operations follow
}

// NewOperations returns the operation records of tables in pool.
func NewOperations(pool *pgxpool.Pool, tables idem.Tables) (*Operations, error) {
	if err := tables.Validate(); err != nil {
		return nil, fmt.Errorf("httpinbox: %w", err)
	}
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	if err != nil {
		return nil, fmt.Errorf("httpinbox: %w", err)
	}
	return &Operations{pool: pool, sql: newOperationSQL(tables), admin: newOperationAdminSQL(tables), ledger: l}, nil
}

// Start moves operation id from accepted to running, in tx. Starting a
// running operation again is a no-op; a finished or unknown one fails with
// ErrOperationState, and one an operator resolved with a *ResolvedError
// (ErrOperationResolved): the worker must not carry it out.
func (o *Operations) Start(ctx context.Context, tx pgx.Tx, id string) error {
	if !validOperationID(id) {
		return fmt.Errorf("httpinbox: start operation %q: %w", id, ErrOperationNotFound)
	}
	tag, err := tx.Exec(ctx, o.sql.start, id)
	if err == nil && tag.RowsAffected() == 0 {
		err = o.already(ctx, tx, id, OperationRunning)
	}
	if err != nil {
		return fmt.Errorf("httpinbox: start operation %s: %w", id, err)
	}
	return nil
}

// Finish ends operation id in state (succeeded, failed, or unknown until
// someone can tell) with result, any value that encodes as JSON (nil for
// none), in tx. The operation may be accepted (work that finishes at once
// need not be started), running, or unknown (a reconciler that learned the
// outcome). Finishing it again in the same state is a no-op (an unknown one
// takes the new result, and keeps the time it became unknown); a finished
// operation never changes (ErrOperationState), whether a worker, the ledger
// effect it follows or an operator finished it. One an operator resolved
// (Operations.Resolve) fails with a *ResolvedError (ErrOperationResolved,
// which matches ErrOperationState too), in whatever state it is finished:
// the worker learns who decided, and must not act on its own outcome.
func (o *Operations) Finish(ctx context.Context, tx pgx.Tx, id string, state OperationState, result any) error {
	if !state.Final() && state != OperationUnknown {
		return fmt.Errorf("httpinbox: finish operation %s: %w: %q is not succeeded, failed or unknown", id, ErrOperationState, state)
	}
	if !validOperationID(id) {
		return fmt.Errorf("httpinbox: finish operation %q: %w", id, ErrOperationNotFound)
	}
	var res []byte
	if result != nil {
		var err error
		if res, err = json.Marshal(result); err != nil {
			return fmt.Errorf("httpinbox: finish operation %s: encode the result: %w", id, err)
		}
	}
	tag, err := tx.Exec(ctx, o.sql.finish, id, state, "", res)
	if err == nil && tag.RowsAffected() == 0 {
		err = o.already(ctx, tx, id, state)
	}
	if err != nil {
		return fmt.Errorf("httpinbox: finish operation %s: %w", id, err)
	}
	return nil
}

// already explains why an operation did not move to want: an operator
// resolved it (a *ResolvedError, whatever want is: the worker must learn
// that it was not its decision), it is there already (nil), it does not
// exist, or it cannot.
func (o *Operations) already(ctx context.Context, tx pgx.Tx, id string, want OperationState) error {
	op, err := scanOperation(tx.QueryRow(ctx, o.sql.get, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrOperationNotFound
	case err != nil:
		return err
	case op.State.Final():
		// Operators only finish operations, and a finished one never
		// changes: a decision about it is the one that finished it.
		d, err := o.resolver(id).decision(ctx, tx, 0)
		switch {
		case err != nil:
			return err
		case d != nil:
			return d
		}
	}
	if op.State == want {
		return nil
	}
	return fmt.Errorf("%w: it is %s", ErrOperationState, op.State)
}

// Get returns operation id, with the outcome of the effect it follows, or
// an error matching ErrOperationNotFound.
func (o *Operations) Get(ctx context.Context, id string) (Operation, error) {
	op, err := o.read(ctx, id)
	if err == nil {
		op, err = o.follow(ctx, op)
	}
	if err != nil {
		return Operation{}, fmt.Errorf("httpinbox: get operation %s: %w", id, err)
	}
	return op, nil
}

// read returns the record of operation id as it is stored.
func (o *Operations) read(ctx context.Context, id string) (Operation, error) {
	if !validOperationID(id) {
		return Operation{}, ErrOperationNotFound // no operation can have it
	}
	op, err := scanOperation(o.pool.QueryRow(ctx, o.sql.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrOperationNotFound
	}
	return op, err
}

// follow moves an unfinished operation that follows an effect as far as
// the effect went, and stores the move.
func (o *Operations) follow(ctx context.Context, op Operation) (Operation, error) {
	if op.Follows == "" || op.State.Final() {
		return op, nil
	}
	e, err := o.ledger.Get(ctx, op.Follows)
	if errors.Is(err, ledger.ErrNotFound) {
		return op, nil // not recorded yet
	}
	if err != nil {
		return op, err
	}
	state, result := effectOutcome(op.State, e)
	if state == op.State {
		return op, nil
	}
	tag, err := o.pool.Exec(ctx, o.sql.finish, op.ID, state, op.State, []byte(result))
	if err != nil {
		return op, fmt.Errorf("follow effect %s: %w", op.Follows, err)
	}
	if tag.RowsAffected() == 0 { // moved meanwhile: read again
		return scanOperation(o.pool.QueryRow(ctx, o.sql.get, op.ID))
	}
	op.State, op.Result, op.UpdatedAt = state, result, time.Now()
	return op, nil
}

// effectOutcome is where an operation in state cur stands once its effect
// is e, and its result.
func effectOutcome(cur OperationState, e ledger.Entry) (OperationState, json.RawMessage) {
	switch e.Status {
	case ledger.StatusSucceeded:
		if json.Valid(e.Response) {
			return OperationSucceeded, e.Response
		}
		return OperationSucceeded, nil
	case ledger.StatusFailedTerminal:
		return OperationFailed, failedResult()
	case ledger.StatusUnknown:
		return OperationUnknown, Problem(http.StatusBadGateway, "OPERATION_OUTCOME_UNKNOWN",
			"the outcome is not known yet; it is being checked").Body
	}
	if cur == OperationAccepted || cur == OperationUnknown {
		return OperationRunning, nil // recorded, waiting, or sent again
	}
	return cur, nil
}

// failedResult is the result of an operation that failed for good without
// a result of its own: the problem document OPERATION_FAILED.
func failedResult() json.RawMessage {
	return Problem(http.StatusBadGateway, "OPERATION_FAILED", "the operation failed for good").Body
}

// scanOperation reads operationColumns.
func scanOperation(row pgx.Row) (Operation, error) {
	var (
		op       Operation
		finished *time.Time
	)
	err := row.Scan(&op.ID, &op.Kind, &op.Tenant, &op.Caller, &op.State, &op.Follows, &op.Location, &op.Fields,
		&op.Result, &op.CreatedAt, &op.UpdatedAt, &finished, &op.ExpiresAt)
	if finished != nil {
		op.FinishedAt = *finished
	}
	return op, err
}
