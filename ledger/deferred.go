package ledger

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgplan"
)

// recordManySQL inserts a batch's effects in one statement; the effects
// already recorded are returned by the second statement for comparison. An
// effect whose id has a tombstone is inserted as suppressed, with a note:
// one probe of the tombstones' primary key per effect (the subquery is
// fenced with OFFSET 0 so that it runs once per effect, as a probe).
const recordManySQL = `INSERT INTO {ledger} (effect_id, effect_type, consumer, message_id, business_key, target,
	idempotency_key, request_hash, request, status, last_error, trace_context)
SELECT v.id, v.typ, v.consumer, v.message_id, v.business_key, v.target, v.key, v.hash, v.request,
	CASE WHEN v.note IS NULL THEN v.status ELSE 'suppressed' END, coalesce(v.note, ''), v.trace::jsonb
FROM (
	SELECT u.*, (SELECT ` + tombstoneNote + ` FROM {tombstones} AS t WHERE t.effect_id = u.id) AS note
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
		$7::text[], $8::bytea[], $9::bytea[], $10::text[], $11::text[])
		AS u(id, typ, consumer, message_id, business_key, target, key, hash, request, status, trace)
	OFFSET 0
) AS v
ON CONFLICT (effect_id) DO NOTHING
RETURNING effect_id, effect_type, status`

const storedHashesSQL = `SELECT effect_id, request_hash FROM {ledger} WHERE effect_id = ANY($1::text[])`

// pendingEffects are the effects recorded during one batch transaction,
// written by Flush with one statement just before the batch commits.
type pendingEffects struct {
	l       *Ledger
	mu      sync.Mutex
	entries []Entry
	byID    map[string]int
}

// add queues e; an id already queued must carry the same request.
func (p *pendingEffects) add(e Entry) (Entry, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, ok := p.byID[e.ID]; ok {
		if p.entries[i].RequestHash != e.RequestHash {
			return Entry{}, &EffectConflictError{EffectID: e.ID, Stored: p.entries[i].RequestHash, Recorded: e.RequestHash}
		}
		return p.entries[i], nil
	}
	if p.byID == nil {
		p.byID = map[string]int{}
	}
	p.byID[e.ID] = len(p.entries)
	p.entries = append(p.entries, e)
	return e, nil
}

// Flush writes the queued effects. An effect id recorded before with
// another request fails the flush with an *EffectConflictError; the runtime
// then runs the batch again with immediate writes, so that the conflict
// reaches the handler that recorded it.
func (p *pendingEffects) Flush(ctx context.Context, tx pgx.Tx) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.entries)
	if n == 0 {
		return nil
	}
	cols := make([][]string, 8)
	for i := range cols {
		cols[i] = make([]string, n)
	}
	hashes := make([][]byte, n)
	requests := make([][]byte, n)
	traces := make([]*string, n)
	for i, e := range p.entries {
		cols[0][i], cols[1][i], cols[2][i], cols[3][i] = e.ID, e.Type, e.Consumer, e.MessageID
		cols[4][i], cols[5][i], cols[6][i], cols[7][i] = e.BusinessKey, e.Target, e.IdempotencyKey, string(e.Status)
		h := e.RequestHash
		hashes[i] = h[:]
		requests[i] = e.Request
		traces[i] = traceJSON(e.TraceContext)
	}
	rows, err := tx.Query(ctx, p.l.sql.recordMany, cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6],
		hashes, requests, cols[7], traces)
	if err != nil {
		return fmt.Errorf("ledger: record %d effects: %w", n, err)
	}
	var (
		inserted []written
		w        written
	)
	_, err = pgx.ForEachRow(rows, []any{&w.id, &w.typ, &w.status}, func() error {
		inserted = append(inserted, w)
		return nil
	})
	if err != nil {
		return fmt.Errorf("ledger: record %d effects: %w", n, err)
	}
	if len(inserted) < n {
		if err := p.compareExisting(ctx, tx, inserted); err != nil {
			return err
		}
	}
	return p.settle(ctx, tx, inserted)
}

// written is an effect a flush inserted, as it was written.
type written struct{ id, typ, status string }

// settle counts the effects the flush wrote as suppressed and, when it
// wrote pending ones, sends the tombstone guard (see guardSQL) and wakes the
// dispatchers, in one round trip.
func (p *pendingEffects) settle(ctx context.Context, tx pgx.Tx, inserted []written) error {
	recorded := make(map[string]Status, len(p.entries))
	for _, e := range p.entries {
		recorded[e.ID] = e.Status
	}
	var pending []string
	for _, w := range inserted {
		switch Status(w.status) {
		case StatusPending:
			pending = append(pending, w.id)
		case StatusSuppressed:
			p.l.metrics.suppress(ctx, w.typ, suppressReason(recorded[w.id]), 1)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(p.l.sql.guardMany, pending).Query(func(rows pgx.Rows) error {
		var typ string
		_, err := pgx.ForEachRow(rows, []any{&typ}, func() error {
			p.l.metrics.suppress(ctx, typ, reasonTombstone, 1)
			return nil
		})
		return err
	})
	b.Queue("SELECT pg_notify($1, '')", p.l.sql.channel)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: guard %d effects and notify dispatchers: %w", len(pending), err)
	}
	return nil
}

// compareExisting checks that the effects not inserted were recorded before
// with the same request.
func (p *pendingEffects) compareExisting(ctx context.Context, tx pgx.Tx, inserted []written) error {
	done := make(map[string]bool, len(inserted))
	for _, w := range inserted {
		done[w.id] = true
	}
	var ids []string
	for _, e := range p.entries {
		if !done[e.ID] {
			ids = append(ids, e.ID)
		}
	}
	rows, err := tx.Query(ctx, p.l.sql.storedHashes, pgplan.PlannedNow(tx.Conn(), ids)...)
	if err != nil {
		return fmt.Errorf("ledger: read %d recorded effects: %w", len(ids), err)
	}
	var id string
	var hash []byte
	stored := map[string]idem.Hash{}
	_, err = pgx.ForEachRow(rows, []any{&id, &hash}, func() error {
		h, err := idem.HashFromBytes(hash)
		stored[id] = h
		return err
	})
	if err != nil {
		return fmt.Errorf("ledger: read %d recorded effects: %w", len(ids), err)
	}
	for _, e := range p.entries {
		if h, ok := stored[e.ID]; ok && h != e.RequestHash {
			return &EffectConflictError{EffectID: e.ID, Stored: h, Recorded: e.RequestHash}
		}
	}
	return nil
}
