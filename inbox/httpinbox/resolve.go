package httpinbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/pglock"
)

// ResolvedError refuses a change to a key or an operation that an operator
// resolved already (Keys.Resolve, Operations.Resolve): a second operator's
// resolution, or a worker's late Start or Finish. It says who decided,
// when, and what. It matches ErrKeyResolved and ErrKeyNotResolvable for a
// key, ErrOperationResolved and ErrOperationState for an operation; read it
// with errors.As.
type ResolvedError struct {
	// ID is the key id (64 hex digits) or the operation id.
	ID string
	// Operator decided, At, moving the record From one state To another,
	// for Reason.
	Operator string
	At       time.Time
	From, To string
	Reason   string

	sentinel, state error
}

// Error says what was decided, by whom and when.
func (e *ResolvedError) Error() string {
	return fmt.Sprintf("%v: %s by %s at %s, %s -> %s: %q", e.sentinel, e.ID, e.Operator,
		e.At.UTC().Format(time.RFC3339), e.From, e.To, e.Reason)
}

// Is matches the sentinel of the record's kind and its state error.
func (e *ResolvedError) Is(target error) bool { return target == e.sentinel || target == e.state }

// operatorWait bounds each lock wait of an operator's resolution: for
// another operator's resolution of the same record to end, and for the
// tables it writes.
const operatorWait = 15 * time.Second

// The statements that serialise operators, for one audit table whose
// record column is {id}: turnSQL reads the newest decision's audit id as of
// its start, then waits for the transaction-level advisory lock $2 that
// every resolution of the record takes; decisionSQL reads the newest
// decision after audit id $2.
const (
	operatorWaitSQL = `SELECT set_config('lock_timeout', $1, true)`

	turnSQL = `SELECT coalesce(max(id), 0), pg_advisory_xact_lock($2)::text IS NOT NULL FROM {audit} WHERE {id} = $1`

	decisionSQL = `SELECT operator, from_state, to_state, reason, at FROM {audit}
WHERE {id} = $1 AND id > $2 ORDER BY id DESC LIMIT 1`
)

// turnStatements are the operator statements of one audit table.
type turnStatements struct{ turn, decision string }

func newTurnStatements(audit, idColumn string) turnStatements {
	r := strings.NewReplacer("{audit}", audit, "{id}", idColumn)
	return turnStatements{turn: r.Replace(turnSQL), decision: r.Replace(decisionSQL)}
}

// resolver is one record as an operator resolves it: its audit
// statements, the advisory lock its resolutions take, its id for the
// database and for people, and the errors of its kind.
type resolver struct {
	sql             turnStatements
	lock            int64
	id              any
	name            string
	sentinel, state error
}

// newResolver returns the resolver of record id (name for people) of table.
func newResolver(sql turnStatements, table string, id any, name string, sentinel, state error) resolver {
	return resolver{sql: sql, lock: pglock.Key("resolve\x00" + table + "\x00" + name), id: id, name: name,
		sentinel: sentinel, state: state}
}

// turn waits in tx, at most operatorWait, until no other operator is
// resolving the record, and returns the decision of any operator that
// resolved it since turn began (nil when none): the resolution that won a
// race with this one. Every later lock wait of tx is bounded by
// operatorWait too.
func (r resolver) turn(ctx context.Context, tx pgx.Tx) (*ResolvedError, error) {
	var (
		seen   int64
		locked bool
	)
	batch := &pgx.Batch{}
	batch.Queue(operatorWaitSQL, strconv.FormatInt(operatorWait.Milliseconds(), 10)+"ms")
	batch.Queue(r.sql.turn, r.id, r.lock).QueryRow(func(row pgx.Row) error { return row.Scan(&seen, &locked) })
	err := tx.SendBatch(ctx, batch).Close()
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
		return nil, fmt.Errorf("another operator has been resolving it for over %s; try again: %w", operatorWait, err)
	}
	if err != nil {
		return nil, err
	}
	return r.decision(ctx, tx, seen)
}

// decision returns the newest operator decision about the record after
// audit id after, or nil when there is none.
func (r resolver) decision(ctx context.Context, tx pgx.Tx, after int64) (*ResolvedError, error) {
	e := &ResolvedError{ID: r.name, sentinel: r.sentinel, state: r.state}
	err := tx.QueryRow(ctx, r.sql.decision, r.id, after).Scan(&e.Operator, &e.From, &e.To, &e.Reason, &e.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the operators' decisions: %w", err)
	}
	return e, nil
}
