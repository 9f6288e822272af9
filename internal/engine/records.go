package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/pgplan"
	"github.com/idemkit/idem/internal/safetext"
)

// What a batch writes besides the inbox when messages fail: their
// dead-letter rows (through package deadletters, which owns the table) and,
// for a queue with a retry queue, the attempts table, which counts failed
// attempts and keeps original routes beyond what headers could be trusted
// with.

// statements are the engine's own SQL for the attempts table, built once.
type statements struct {
	lookupAttempts, recordFailures, clearAttempts, markStart, unmarkStart string
}

func newStatements(t idem.Tables) statements {
	at := t.Table("attempts")
	return statements{
		// Joined to whole keys and planned at each execution, like the
		// inbox's lookups of a batch's keys.
		lookupAttempts: `SELECT a.message_id, a.failures, a.crashes, a.exchange, a.routing_key FROM ` + at +
			` AS a JOIN unnest($1::text[], $2::text[]) AS u(c, m) ON a.consumer = u.c AND a.message_id = u.m`,
		// A failed attempt: the count and the original route; the message
		// is no longer running, so a crash no longer points at it.
		recordFailures: `INSERT INTO ` + at + ` AS a (consumer, message_id, failures, exchange, routing_key)
SELECT $1, t.message_id, t.failures, t.exchange, t.routing_key
FROM unnest($2::text[], $3::int[], $4::text[], $5::text[]) AS t(message_id, failures, exchange, routing_key)
ON CONFLICT (consumer, message_id) DO UPDATE
SET failures = greatest(a.failures, EXCLUDED.failures), crashes = 0, exchange = EXCLUDED.exchange,
	routing_key = EXCLUDED.routing_key, updated_at = now()`,
		clearAttempts: `DELETE FROM ` + at + ` WHERE consumer = $1 AND message_id = ANY($2::text[])`,
		markStart: `INSERT INTO ` + at + ` AS a (consumer, message_id, crashes, exchange, routing_key) VALUES ($1, $2, 1, $3, $4)
ON CONFLICT (consumer, message_id) DO UPDATE SET crashes = a.crashes + 1, updated_at = now()
RETURNING failures, crashes, exchange, routing_key`,
		unmarkStart: `UPDATE ` + at + ` SET crashes = greatest(crashes - 1, 0) WHERE consumer = $1 AND message_id = $2`,
	}
}

// DeleteAttemptsBefore deletes the attempts rows of tables last updated
// before cutoff, chunk rows per statement, each its own transaction; it
// returns how many it deleted (so far, when it fails). The retention
// package calls it with its cutoff.
func DeleteAttemptsBefore(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (int64, error) {
	n, err := chunked.Delete(ctx, pool, chunked.OlderThan(tables.Table("attempts"), "updated_at"), cutoff, chunk, 1)
	if err != nil {
		return n[0], fmt.Errorf("engine: delete attempts before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], nil
}

// attemptRow is what the attempts table holds for one message.
type attemptRow struct {
	failures, crashes    int
	exchange, routingKey string
}

// apply gives it what its row says: its attempt number and original route.
// It writes only what changes, so that a handler of an earlier attempt
// that was abandoned, and may still read the message, races with nothing
// it reads.
func (r *attemptRow) apply(it *Item) {
	it.row = r
	if n := max(it.Attempt, r.failures+1); n != it.Attempt {
		it.Attempt = n
	}
	if (r.exchange != "" || r.routingKey != "") && (it.Exchange != r.exchange || it.RoutingKey != r.routingKey) {
		it.Exchange, it.RoutingKey = r.exchange, r.routingKey
	}
}

// lookupAttempts reads the attempts rows of the runnable items that came
// back from the retry queue or were delivered before, and applies them.
func (e *Engine) lookupAttempts(ctx context.Context, tx pgx.Tx, scope string, items []*Item, runnable []int) error {
	var scopes, ids []string
	byID := map[string][]*Item{}
	for _, i := range runnable {
		it := items[i]
		if it.row == nil && (it.Returned || it.Suspect) {
			scopes, ids = append(scopes, scope), append(ids, it.ID)
			byID[it.ID] = append(byID[it.ID], it)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, e.sql.lookupAttempts, pgplan.PlannedNow(tx.Conn(), scopes, ids)...)
	if err != nil {
		return fmt.Errorf("engine: read attempts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		r := &attemptRow{}
		if err := rows.Scan(&id, &r.failures, &r.crashes, &r.exchange, &r.routingKey); err != nil {
			return fmt.Errorf("engine: read attempts: %w", err)
		}
		for _, it := range byID[id] {
			r.apply(it)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("engine: read attempts: %w", err)
	}
	return nil
}

// writeRecords writes, in one round trip, the batch's dead-letter rows and
// attempt counts: a failed attempt of a retried message, the rows of
// messages settled for good deleted.
func (e *Engine) writeRecords(ctx context.Context, tx pgx.Tx, scope string, p *rules, items []*Item, results []Result) error {
	b := &pgx.Batch{}
	var dead []deadletters.Row
	var failedIDs, exchanges, keys, clearIDs []string
	var failures []int32
	for i, r := range results {
		it := items[i]
		switch {
		case r.Outcome == idem.DeadLettered:
			dead = append(dead, e.deadLetterRow(it, r))
		case !p.retryQueue:
		case r.Outcome == idem.Retried:
			failedIDs = append(failedIDs, it.ID)
			failures = append(failures, int32(it.Attempt))
			exchanges = append(exchanges, safetext.Clean(it.Exchange))
			keys = append(keys, safetext.Clean(it.RoutingKey))
		}
		if p.retryQueue && it.row != nil && r.Outcome.Final() {
			clearIDs = append(clearIDs, it.ID)
		}
	}
	e.dead.Queue(b, scope, dead)
	if len(failedIDs) > 0 {
		b.Queue(e.sql.recordFailures, scope, failedIDs, failures, exchanges, keys)
	}
	if len(clearIDs) > 0 {
		b.Queue(e.sql.clearAttempts, scope, clearIDs)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record dead letters and attempts: %w", err)
	}
	return nil
}

// deadLetterRow is the dead-letter row of it, dead-lettered with r.
func (e *Engine) deadLetterRow(it *Item, r Result) deadletters.Row {
	row := deadletters.Row{MessageID: deadLetterID(it), PayloadHash: it.Hash, StoredHash: r.StoredHash, Reason: r.Reason,
		Error: safetext.Error(r.Err), Source: safetext.Clean(it.Source), Exchange: safetext.Clean(it.Exchange),
		RoutingKey: safetext.Clean(it.RoutingKey), Attempts: max(it.Attempt, 1)}
	if e.cfg.StorePayloads {
		row.Payload = it.Body
	}
	return row
}

// deadLetterID is what an operator finds a dead letter by: its id, or for a
// message without a usable one, "sha256:" and its payload hash (the
// x-idem-payload-hash header of the copy in the dead-letter queue).
func deadLetterID(it *Item) string {
	if it.ID != "" {
		return safetext.Clean(it.ID)
	}
	return "sha256:" + it.Hash.String()
}

// markStart counts, in a statement of its own that commits at once, that
// it is about to run alone; the count is cleared in the transaction that
// settles it, so what is left counts the workers it was running in when
// they died. It applies the item's row and returns its crash count.
func (e *Engine) markStart(ctx context.Context, scope string, it *Item) (int, error) {
	r := &attemptRow{}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CommitTimeout)
	defer cancel()
	err := e.cfg.Pool.QueryRow(ctx, e.sql.markStart, scope, it.ID, safetext.Clean(it.Exchange), safetext.Clean(it.RoutingKey)).
		Scan(&r.failures, &r.crashes, &r.exchange, &r.routingKey)
	if err != nil {
		return 0, fmt.Errorf("engine: mark %s as running alone: %w", shortID(it.ID), err)
	}
	r.apply(it)
	return r.crashes, nil
}

// unmarkStart takes back a start that ended without a crash and without a
// commit (the batch transaction failed): it must not count as a crash.
func (e *Engine) unmarkStart(ctx context.Context, scope string, it *Item) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CommitTimeout)
	defer cancel()
	if _, err := e.cfg.Pool.Exec(uctx, e.sql.unmarkStart, scope, it.ID); err != nil {
		e.cfg.Logger.Warn("could not take back the start of a message run alone; a later crash counts one more",
			"message_id", shortID(it.ID), "error", err)
	}
}

// recordFailure counts, in a statement of its own, a failed attempt of a
// message whose transaction could not commit.
func (e *Engine) recordFailure(ctx context.Context, scope string, it *Item) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CommitTimeout)
	defer cancel()
	_, err := e.cfg.Pool.Exec(rctx, e.sql.recordFailures, scope, []string{it.ID}, []int32{int32(it.Attempt)},
		[]string{safetext.Clean(it.Exchange)}, []string{safetext.Clean(it.RoutingKey)})
	if err != nil {
		e.cfg.Logger.Warn("could not count a failed attempt", "message_id", shortID(it.ID), "error", err)
	}
}
