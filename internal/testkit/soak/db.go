package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// consumerNames are the inbox scopes of the examples' consumers.
var consumerNames = [...]string{quickstart: "quickstart", payments: "payments", orders: "orders-overview", liveness: soakworker.ConsumerName}

// monitor is the soak's own view of the examples' tables. Its sessions carry
// an application_name of their own, so the backends fault spares them.
type monitor struct {
	pool   *pgxpool.Pool
	tables map[example]idem.Tables

	// What the retention fault saw cleanup delete, per example: the rows
	// of messages that took effect and must never be applied again.
	forgotMu sync.Mutex
	forgot   map[example]map[string]inboxRow
	// again lists, per example, the messages a cleanup deleted the row of
	// a second time: the row had come back in between.
	again map[example][]string
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
		return found || db.forgotten(ex, id), err
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

// inboxRow is an inbox row, as far as the checks need it.
type inboxRow struct {
	hash     [32]byte
	source   string
	received time.Time
	// lastSeen is the last claim of any copy of the message, lastOffset
	// the highest stream offset of any copy (nil for a queue): what
	// retention goes by.
	lastSeen   time.Time
	lastOffset *int64
}

// inboxRows returns the inbox of ex by message id.
func (db *monitor) inboxRows(ctx context.Context, ex example) (map[string]inboxRow, error) {
	rows, err := db.pool.Query(ctx, `SELECT message_id, payload_hash, source, received_at,
		coalesce(seen_at, received_at), GREATEST(stream_offset, seen_offset) FROM `+db.t(ex, "inbox")+
		` WHERE consumer = $1`, consumerNames[ex])
	if err != nil {
		return nil, fmt.Errorf("read the %s inbox: %w", ex, err)
	}
	out := map[string]inboxRow{}
	var (
		id string
		h  []byte
		r  inboxRow
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &h, &r.source, &r.received, &r.lastSeen, &r.lastOffset}, func() error {
		r.hash = [32]byte(h)
		out[id] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the %s inbox: %w", ex, err)
	}
	return out, nil
}

// forget records the rows of ex a cleanup deleted.
func (db *monitor) forget(ex example, gone map[string]inboxRow) {
	db.forgotMu.Lock()
	defer db.forgotMu.Unlock()
	if db.forgot == nil {
		db.forgot, db.again = map[example]map[string]inboxRow{}, map[example][]string{}
	}
	if db.forgot[ex] == nil {
		db.forgot[ex] = map[string]inboxRow{}
	}
	for id, r := range gone {
		if _, ok := db.forgot[ex][id]; ok {
			db.again[ex] = append(db.again[ex], fmt.Sprintf("%s: its row was deleted twice, so it came back in between (applied again)", id))
			continue
		}
		db.forgot[ex][id] = r
	}
}

// forgotten reports whether a cleanup deleted the row of message id of ex.
func (db *monitor) forgotten(ex example, id string) bool {
	db.forgotMu.Lock()
	defer db.forgotMu.Unlock()
	_, ok := db.forgot[ex][id]
	return ok
}

// recall returns what the inbox of ex holds and held, message id → payload
// hash: its rows now and those cleanup deleted. back lists the forgotten
// messages that came back, each applied a second time: a row for it again,
// or its row deleted twice.
func (db *monitor) recall(ctx context.Context, ex example) (held map[string][32]byte, forgotten int, back []string, err error) {
	rows, err := db.inboxRows(ctx, ex)
	if err != nil {
		return nil, 0, nil, err
	}
	held, forgotten, back = db.merge(ex, rows)
	return held, forgotten, back, nil
}

// merge is recall on the rows the inbox of ex holds now.
func (db *monitor) merge(ex example, rows map[string]inboxRow) (held map[string][32]byte, forgotten int, back []string) {
	held = make(map[string][32]byte, len(rows))
	for id, r := range rows {
		held[id] = r.hash
	}
	db.forgotMu.Lock()
	defer db.forgotMu.Unlock()
	back = slices.Clone(db.again[ex])
	for id, r := range db.forgot[ex] {
		if now, ok := rows[id]; ok {
			back = append(back, fmt.Sprintf("%s: claimed as new at %s after cleanup deleted its row (last seen %s)",
				id, now.received.UTC().Format(time.RFC3339Nano), r.lastSeen.UTC().Format(time.RFC3339Nano)))
		}
		held[id] = r.hash
	}
	slices.Sort(back)
	return held, len(db.forgot[ex]), back
}

// now is the database's clock.
func (db *monitor) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := db.pool.QueryRow(ctx, `SELECT now()`).Scan(&t)
	return t, err
}

// deadLetter is a dead letter as the table or the queue holds it.
type deadLetter struct {
	id     string
	hash   [32]byte
	reason string
}

// deadLetterRow is a dead_letters row: the dead letter, when it entered
// the table (and the dead-letter queue) and who redrove it.
type deadLetterRow struct {
	deadLetter
	row        int64
	at         time.Time
	redriven   bool
	redrivenBy string
}

// deadLetterRows returns the dead_letters rows of ex in the order they
// were written.
func (db *monitor) deadLetterRows(ctx context.Context, ex example) ([]deadLetterRow, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, message_id, payload_hash, reason, dead_lettered_at,
		redriven_at IS NOT NULL, coalesce(redriven_by, '') FROM `+db.t(ex, "dead_letters")+
		` WHERE consumer = $1 ORDER BY id`, consumerNames[ex])
	if err != nil {
		return nil, fmt.Errorf("read the %s dead letters: %w", ex, err)
	}
	var (
		out []deadLetterRow
		d   deadLetterRow
		h   []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&d.row, &d.id, &h, &d.reason, &d.at, &d.redriven, &d.redrivenBy}, func() error {
		d.hash = [32]byte(h)
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the %s dead letters: %w", ex, err)
	}
	return out, nil
}

// deadLetters returns the dead_letters rows of ex.
func (db *monitor) deadLetters(ctx context.Context, ex example) ([]deadLetter, error) {
	rows, err := db.deadLetterRows(ctx, ex)
	out := make([]deadLetter, len(rows))
	for i, r := range rows {
		out[i] = r.deadLetter
	}
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
