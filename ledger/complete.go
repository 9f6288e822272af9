package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// outcome is the status one call leaves an effect in, waiting to be written.
type outcome struct {
	id, owner, typ string
	status         Status
	delay          time.Duration // next_attempt_at = now() + delay
	attempt        int           // the effect's attempt count
	lookup         bool          // a reconciler's lookup, not an attempt
	maybeSent      bool          // an attempt may have taken effect (Entry.MaybeSent)
	lastError      string
	responseHash   []byte
	response       []byte
}

// claimSQL takes up to $2 due effects of the types $1 for owner $3, with a
// lease of $4 milliseconds, in one autocommitted statement.
const claimSQL = `WITH due AS (
	SELECT effect_id AS due_id FROM {ledger}
	WHERE status IN ('pending', 'failed_retryable') AND next_attempt_at <= now()
		AND effect_type = ANY($1::text[])
	ORDER BY next_attempt_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE {ledger} SET status = 'in_flight', lock_owner = $3,
	locked_until = now() + $4 * interval '1 millisecond', attempt_count = attempt_count + 1
FROM due WHERE effect_id = due.due_id
RETURNING {columns}`

// claimUnknownSQL takes unknown effects due for a lookup; a lookup is not an
// attempt.
const claimUnknownSQL = `WITH due AS (
	SELECT effect_id AS due_id FROM {ledger}
	WHERE status = 'unknown' AND next_attempt_at <= now() AND effect_type = ANY($1::text[])
	ORDER BY next_attempt_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE {ledger} SET status = 'in_flight', lock_owner = $3,
	locked_until = now() + $4 * interval '1 millisecond'
FROM due WHERE effect_id = due.due_id
RETURNING {columns}`

// completeSQL writes a batch of outcomes. Each row is guarded by its claim's
// owner token: a claim that was swept and claimed again, or resolved by an
// operator, no longer matches and is left alone. An unknown effect keeps its
// owner token, so a late outcome of the same claim may still settle it.
const completeSQL = `UPDATE {ledger} AS l SET
	status = u.status,
	next_attempt_at = now() + u.delay_ms * interval '1 millisecond',
	locked_until = NULL,
	lock_owner = CASE WHEN u.status = 'unknown' THEN l.lock_owner END,
	last_error = u.last_error,
	response_hash = u.response_hash,
	response = u.response,
	maybe_sent = u.maybe_sent,
	completed_at = CASE WHEN u.status IN ('succeeded', 'failed_terminal') THEN now() END
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::bytea[],
		$8::boolean[])
	AS u(effect_id, lock_owner, status, delay_ms, last_error, response_hash, response, maybe_sent)
WHERE l.effect_id = u.effect_id AND l.lock_owner = u.lock_owner
	AND l.status IN ('in_flight', 'unknown')
RETURNING l.effect_id`

// sweepSQL settles effects of the types $1 whose lease ended while in
// flight: due again with the same key when the executor deduplicates ($2)
// and attempts remain ($3), unknown otherwise. Either way the call may
// have taken effect.
const sweepSQL = `WITH expired AS (
	SELECT effect_id AS expired_id,
		effect_type = ANY($2::text[]) AND attempt_count < $3 AS retry
	FROM {ledger}
	WHERE status = 'in_flight' AND locked_until < now() AND effect_type = ANY($1::text[])
	FOR UPDATE SKIP LOCKED
)
UPDATE {ledger} SET
	status = CASE WHEN expired.retry THEN 'failed_retryable' ELSE 'unknown' END,
	lock_owner = CASE WHEN expired.retry THEN NULL ELSE lock_owner END,
	locked_until = NULL,
	next_attempt_at = now(),
	maybe_sent = true,
	last_error = 'lease expired while in flight'
FROM expired WHERE effect_id = expired.expired_id
RETURNING effect_id, effect_type, status, attempt_count`

// gaugesSQL reads what the gauges report: unknown effects, and how long the
// oldest due effect has waited.
const gaugesSQL = `SELECT
	(SELECT count(*) FROM {ledger} WHERE status = 'unknown'),
	(SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at)), 0)::float8 FROM {ledger}
		WHERE status IN ('pending', 'failed_retryable') AND next_attempt_at <= now())`

// completeLoop writes outcomes in batches until finish is closed and every
// buffered outcome is written.
func (d *Dispatcher) completeLoop(r *run, finish <-chan struct{}) {
	const maxBatch = 1000
	batch := make([]outcome, 0, 64)
	for {
		done := false
		select {
		case o := <-r.outcomes:
			batch = append(batch, o)
		case <-finish:
			done = true
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case o := <-r.outcomes:
				batch = append(batch, o)
			default:
				break drain
			}
		}
		if len(batch) > 0 {
			d.writeOutcomes(r.detached, batch)
			batch = batch[:0]
		}
		if done && len(r.outcomes) == 0 {
			return
		}
	}
}

// writeOutcomes writes a batch, retrying a few times. If the database stays
// unreachable the effects keep their leases, and the sweep settles them.
func (d *Dispatcher) writeOutcomes(ctx context.Context, batch []outcome) {
	n := len(batch)
	ids, owners, statuses, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	delays, hashes, responses := make([]int64, n), make([][]byte, n), make([][]byte, n)
	maybeSent := make([]bool, n)
	for i, o := range batch {
		ids[i], owners[i], statuses[i], errs[i] = o.id, o.owner, string(o.status), o.lastError
		delays[i], hashes[i], responses[i] = o.delay.Milliseconds(), o.responseHash, o.response
		maybeSent[i] = o.maybeSent
	}
	var (
		written map[string]bool
		err     error
	)
	for try := range 4 {
		if try > 0 {
			time.Sleep(time.Duration(100<<try) * time.Millisecond)
		}
		written, err = d.complete(ctx, ids, owners, statuses, delays, errs, hashes, responses, maybeSent)
		if err == nil {
			break
		}
		d.log.Warn("ledger: write outcomes", "effects", n, "try", try+1, "error", err)
	}
	if err != nil {
		d.log.Error("ledger: outcomes not written; their leases will expire and the sweep settles them",
			"effects", n, "error", err)
		return
	}
	for _, o := range batch {
		if written[o.id] {
			d.metrics.transition(ctx, o.typ, o.status, 1)
			d.warnSettled(o)
			continue
		}
		d.metrics.refused.Add(ctx, 1, metric.WithAttributes(typeAttr(o.typ)))
		d.log.Warn("ledger: outcome refused, the claim is no longer held (lease expired; another claim or an operator owns the effect)",
			"effect_id", o.id, "effect_type", o.typ, "status", string(o.status))
	}
}

// complete runs completeSQL and returns the ids it updated.
func (d *Dispatcher) complete(ctx context.Context, ids, owners, statuses []string, delays []int64,
	errs []string, hashes, responses [][]byte, maybeSent []bool) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := d.cfg.Pool.Query(ctx, d.sql.complete, ids, owners, statuses, delays, errs, hashes, responses, maybeSent)
	if err != nil {
		return nil, fmt.Errorf("ledger: complete: %w", err)
	}
	defer rows.Close()
	written := make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("ledger: complete: %w", err)
		}
		written[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: complete: %w", err)
	}
	return written, nil
}

// sweepLoop settles expired leases, looks up unknown effects whose executor
// can reconcile them and refreshes the gauges, every PollInterval. Each of
// these database calls is bounded by dbTimeout, and the loop ticks before
// each, so that a stuck call shows in Health.
func (d *Dispatcher) sweepLoop(r *run) {
	t := time.NewTicker(d.cfg.PollInterval)
	defer t.Stop()
	for {
		d.vitals.sweep.ticked()
		err := d.sweep(r.ctx)
		if err != nil && r.ctx.Err() == nil {
			d.log.Error("ledger: sweep expired leases", "error", err)
		}
		if len(d.reconcile) > 0 {
			d.vitals.sweep.ticked()
			lerr := d.lookupUnknown(r)
			if lerr != nil && r.ctx.Err() == nil {
				d.log.Error("ledger: claim unknown effects for lookup", "error", lerr)
			}
			err = cmp.Or(err, lerr)
		}
		if r.ctx.Err() == nil {
			d.vitals.sweep.observe(err)
		}
		d.vitals.sweep.ticked()
		if err := d.refreshGauges(r.ctx); err != nil && r.ctx.Err() == nil {
			d.log.Warn("ledger: refresh gauges", "error", err)
		}
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep settles expired leases in one statement, bounded by dbTimeout.
func (d *Dispatcher) sweep(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.dbTimeout)
	defer cancel()
	rows, err := d.cfg.Pool.Query(ctx, d.sql.sweep, d.types, d.dedup, d.cfg.MaxAttempts)
	if err != nil {
		return fmt.Errorf("ledger: sweep: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, typ, status string
			attempt         int
		)
		if err := rows.Scan(&id, &typ, &status, &attempt); err != nil {
			return fmt.Errorf("ledger: sweep: %w", err)
		}
		d.metrics.transition(ctx, typ, Status(status), 1)
		msg := "ledger: lease expired while in flight; retrying with the same key"
		if Status(status) == StatusUnknown {
			msg = "ledger: effect outcome unknown (lease expired while in flight); resolve it with idem ledger resolve"
		}
		d.log.Warn(msg, "effect_id", id, "effect_type", typ, "status", status, "attempt", attempt,
			"error", "lease expired while in flight")
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ledger: sweep: %w", err)
	}
	return nil
}

// lookupUnknown claims unknown effects due for a lookup, as far as there is
// room, and asks their reconcilers.
func (d *Dispatcher) lookupUnknown(r *run) error {
	free := min(d.cfg.Concurrency-int(r.inflight.Load()), d.cfg.BatchSize)
	if free <= 0 || r.ctx.Err() != nil {
		return nil
	}
	owner := fmt.Sprintf("%s/%d", d.owner, d.seq.Add(1))
	deadline := time.Now().Add(d.cfg.Lease * 9 / 10)
	// As a claim (see claim), it runs detached from shutdown, bounded.
	cctx, cancel := context.WithTimeout(r.detached, d.dbTimeout)
	defer cancel()
	entries, err := d.claimRows(cctx, d.sql.claimUnknown, d.reconcile, free, owner)
	if err != nil || len(entries) == 0 {
		return err
	}
	d.start(r, entries, deadline, true)
	return nil
}

// refreshGauges reads the gauges' values, bounded by dbTimeout.
func (d *Dispatcher) refreshGauges(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.dbTimeout)
	defer cancel()
	var (
		unknown int64
		oldest  float64
	)
	if err := d.cfg.Pool.QueryRow(ctx, d.sql.gauges).Scan(&unknown, &oldest); err != nil {
		return fmt.Errorf("ledger: gauges: %w", err)
	}
	d.metrics.unknown.Store(unknown)
	d.metrics.oldestDueBits.Store(math.Float64bits(oldest))
	return nil
}

// listen wakes the claim loop whenever a Record commits, until ctx ends. It
// reconnects after errors; polling covers the gaps.
func (d *Dispatcher) listen(ctx context.Context, wake chan<- struct{}) {
	for {
		err := d.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		d.log.Warn("ledger: listen for notifications; polling until it is back", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.cfg.PollInterval):
		}
	}
}

// listenOnce listens on a connection of its own until the connection fails
// or ctx ends.
func (d *Dispatcher) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	setup, cancel := context.WithTimeout(ctx, d.dbTimeout)
	defer cancel()
	c, err := d.cfg.Pool.Acquire(setup)
	if err != nil {
		return fmt.Errorf("ledger: listen: acquire a connection: %w", err)
	}
	// The listening connection leaves the pool: it must never serve a query
	// while notifications queue on it.
	conn := c.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(setup, d.sql.listen); err != nil {
		return fmt.Errorf("ledger: listen: %w", err)
	}
	d.vitals.listening.Store(true)
	defer d.vitals.listening.Store(false)
	for {
		// Wake once after LISTEN too: a Record that committed before it
		// took effect sent its notification to nobody.
		select {
		case wake <- struct{}{}:
		default:
		}
		if err := d.awaitNotification(ctx, conn); err != nil {
			return err
		}
	}
}

// awaitNotification waits for the next notification on conn, until ctx
// ends. After each PollInterval (at most dbTimeout) without one it pings
// conn, bounded by dbTimeout: a connection that stopped answering without
// being reset (a failover, a dead peer) must not pass for a listening one.
func (d *Dispatcher) awaitNotification(ctx context.Context, conn *pgx.Conn) error {
	quiet := min(d.cfg.PollInterval, d.dbTimeout)
	for {
		wctx, cancel := context.WithTimeout(ctx, quiet)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("ledger: listen: wait for a notification: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, d.dbTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("ledger: listen: ping the listening connection: %w", err)
		}
	}
}

func typeAttr(typ string) attribute.KeyValue { return attribute.String("effect_type", typ) }
func statusAttr(s Status) attribute.KeyValue { return attribute.String("status", string(s)) }

// warnSettled logs the outcomes an operator must look at: an effect whose
// outcome became unknown (not a reconciler's lookup that left it unknown),
// and one that failed for good.
func (d *Dispatcher) warnSettled(o outcome) {
	var msg string
	switch {
	case o.status == StatusFailedTerminal:
		msg = "ledger: effect failed for good"
	case o.status == StatusUnknown && !o.lookup:
		msg = "ledger: effect outcome unknown; resolve it with idem ledger resolve"
	default:
		return
	}
	d.log.Warn(msg, "effect_id", o.id, "effect_type", o.typ, "status", string(o.status), "attempt", o.attempt,
		"error", truncate(o.lastError, 256))
}
