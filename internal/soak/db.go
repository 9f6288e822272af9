package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/soak/soakworker"
)

// consumerNames are the inbox scopes of the examples' consumers.
var consumerNames = [...]string{quickstart: "quickstart", payments: "payments", orders: "orders-overview", liveness: soakworker.ConsumerName}

// monitor is the soak's own view of the examples' tables. Its sessions carry
// an application_name of their own, so the backends fault spares them.
type monitor struct {
	pool   *pgxpool.Pool
	tables map[example]idem.Tables
}

func (db *monitor) t(ex example, table string) string { return db.tables[ex].Table(table) }

// table is a business table of an example, quoted.
func (db *monitor) table(ex example, name string) string {
	return pgx.Identifier{db.tables[ex].Schema, name}.Sanitize()
}

// inFlight returns the capture effects the payments worker with process id
// pid claimed at least 200ms ago and has not settled: calls the gateway is
// stalling (a normal call takes a millisecond or two). The dispatcher's owner
// tokens are host/pid/random/sequence; a claim holds the effect until
// claim time + lease.
func (db *monitor) inFlight(ctx context.Context, pid int) ([]string, error) {
	if pid == 0 {
		return nil, nil
	}
	rows, err := db.pool.Query(ctx, `SELECT effect_id FROM `+db.t(payments, "ledger")+
		` WHERE status = 'in_flight' AND split_part(lock_owner, '/', 2) = $1
		AND locked_until <= now() + $2 * interval '1 millisecond'`,
		strconv.Itoa(pid), (dispatcherLease - 200*time.Millisecond).Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("in-flight effects: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// waitSucceeded waits until every effect of ids succeeded and returns the
// time since t0.
func (db *monitor) waitSucceeded(ctx context.Context, ids []string, t0 time.Time) (time.Duration, bool) {
	return poll(ctx, 100*time.Millisecond, t0, func() (bool, error) {
		var open int
		err := db.pool.QueryRow(ctx, `SELECT count(*) FROM `+db.t(payments, "ledger")+
			` WHERE effect_id = ANY($1) AND status <> 'succeeded'`, ids).Scan(&open)
		return open == 0, err
	})
}

// waitProcessed waits until the inbox of ex holds message id and returns the
// time since t0.
func (db *monitor) waitProcessed(ctx context.Context, ex example, id string, t0 time.Time) (time.Duration, bool) {
	return poll(ctx, 20*time.Millisecond, t0, func() (bool, error) {
		var found bool
		err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+db.t(ex, "inbox")+
			` WHERE consumer = $1 AND message_id = $2)`, consumerNames[ex], id).Scan(&found)
		return found, err
	})
}

// poll calls cond every interval until it is true or ctx ends; it returns
// the time since t0 when cond became true.
func poll(ctx context.Context, interval time.Duration, t0 time.Time, cond func() (bool, error)) (time.Duration, bool) {
	for {
		ok, err := cond()
		if err == nil && ok {
			return time.Since(t0), true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-time.After(interval):
		}
	}
}

// terminate ends every session whose application_name is in names.
func (db *monitor) terminate(ctx context.Context, names []string) (int, error) {
	var n int
	err := db.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = ANY($1) AND pid <> pg_backend_pid()`, names).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pg_terminate_backend: %w", err)
	}
	return n, nil
}

// openEffects counts the effects of ex the dispatcher still has to settle.
func (db *monitor) openEffects(ctx context.Context, ex example) (int, error) {
	var n int
	err := db.pool.QueryRow(ctx, `SELECT count(*) FROM `+db.t(ex, "ledger")+
		` WHERE status IN ('pending', 'in_flight', 'failed_retryable')`).Scan(&n)
	return n, err
}

// checkpoint returns the orders consumer's last committed offset, or -1.
func (db *monitor) checkpoint(ctx context.Context, stream string) (int64, error) {
	var off int64
	err := db.pool.QueryRow(ctx, `SELECT last_offset FROM `+db.t(orders, "checkpoints")+
		` WHERE consumer = $1 AND stream = $2`, consumerNames[orders], stream).Scan(&off)
	if err == pgx.ErrNoRows {
		return -1, nil
	}
	return off, err
}

// inbox returns the inbox of ex: message id → payload hash.
func (db *monitor) inbox(ctx context.Context, ex example) (map[string][32]byte, error) {
	rows, err := db.pool.Query(ctx, `SELECT message_id, payload_hash FROM `+db.t(ex, "inbox")+
		` WHERE consumer = $1`, consumerNames[ex])
	if err != nil {
		return nil, fmt.Errorf("read the %s inbox: %w", ex, err)
	}
	out := map[string][32]byte{}
	var (
		id string
		h  []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &h}, func() error {
		out[id] = [32]byte(h)
		return nil
	})
	return out, err
}

// deadLetter is a dead letter as the table or the queue holds it.
type deadLetter struct {
	id     string
	hash   [32]byte
	reason string
}

// deadLetters returns the dead_letters rows of ex.
func (db *monitor) deadLetters(ctx context.Context, ex example) ([]deadLetter, error) {
	rows, err := db.pool.Query(ctx, `SELECT message_id, payload_hash, reason FROM `+db.t(ex, "dead_letters")+
		` WHERE consumer = $1`, consumerNames[ex])
	if err != nil {
		return nil, fmt.Errorf("read the %s dead letters: %w", ex, err)
	}
	var (
		out []deadLetter
		d   deadLetter
		h   []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&d.id, &h, &d.reason}, func() error {
		d.hash = [32]byte(h)
		out = append(out, d)
		return nil
	})
	return out, err
}

// effect is a ledger row, as far as the checks need it.
type effect struct {
	key, status, lastError string
	attempts               int
	took                   time.Duration // created to completed
}

// effects returns the ledger of ex by business key (an effect per key is
// expected; a second one shows as a duplicate key in dups).
func (db *monitor) effects(ctx context.Context, ex example) (map[string]effect, []string, error) {
	rows, err := db.pool.Query(ctx, `SELECT business_key, status, last_error, attempt_count,
		coalesce(extract(epoch FROM completed_at - created_at), 0)::float8 FROM `+db.t(ex, "ledger"))
	if err != nil {
		return nil, nil, fmt.Errorf("read the %s ledger: %w", ex, err)
	}
	out := map[string]effect{}
	var (
		dups []string
		e    effect
		secs float64
	)
	_, err = pgx.ForEachRow(rows, []any{&e.key, &e.status, &e.lastError, &e.attempts, &secs}, func() error {
		e.took = time.Duration(secs * float64(time.Second))
		if _, ok := out[e.key]; ok {
			dups = append(dups, e.key)
		}
		out[e.key] = e
		return nil
	})
	return out, dups, err
}

// deadLettered returns, for the messages of ids that have a dead_letters
// row in ex, the reason of one of their rows.
func (db *monitor) deadLettered(ctx context.Context, ex example, ids []string) (map[string]string, error) {
	rows, err := db.pool.Query(ctx, `SELECT DISTINCT ON (message_id) message_id, reason FROM `+db.t(ex, "dead_letters")+
		` WHERE consumer = $1 AND message_id = ANY($2)`, consumerNames[ex], ids)
	if err != nil {
		return nil, fmt.Errorf("read the %s dead letters: %w", ex, err)
	}
	out := map[string]string{}
	var id, reason string
	_, err = pgx.ForEachRow(rows, []any{&id, &reason}, func() error { out[id] = reason; return nil })
	return out, err
}

// applied returns the liveness worker's applied log: per message id, the
// tags of the processes that applied it (one, unless it was applied twice).
func (db *monitor) applied(ctx context.Context) (map[string][]string, error) {
	rows, err := db.pool.Query(ctx, `SELECT message_id, worker FROM `+db.table(liveness, "applied"))
	if err != nil {
		return nil, fmt.Errorf("read the liveness applied log: %w", err)
	}
	out := map[string][]string{}
	var id, worker string
	_, err = pgx.ForEachRow(rows, []any{&id, &worker}, func() error {
		out[id] = append(out[id], worker)
		return nil
	})
	return out, err
}

// deadLetterAttempts returns the attempts recorded in the dead_letters rows
// of ex for the messages of ids, a list per message (one per row).
func (db *monitor) deadLetterAttempts(ctx context.Context, ex example, ids []string) (map[string][]int, error) {
	rows, err := db.pool.Query(ctx, `SELECT message_id, attempts FROM `+db.t(ex, "dead_letters")+
		` WHERE consumer = $1 AND message_id = ANY($2)`, consumerNames[ex], ids)
	if err != nil {
		return nil, fmt.Errorf("read the %s dead letters: %w", ex, err)
	}
	out := map[string][]int{}
	var (
		id string
		n  int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = append(out[id], n); return nil })
	return out, err
}
