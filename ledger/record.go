package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tracing"
)

// Config configures a Ledger.
type Config struct {
	// Pool is used by the operator functions (List, Get, Resolve, Stats).
	// Record uses the caller's transaction and does not need it. Optional.
	Pool *pgxpool.Pool
	// Tables says where the ledger's tables live. Default: idem's defaults.
	Tables idem.Tables
}

// Ledger records effects inside the caller's transactions and answers
// operators' questions about them. It is safe for concurrent use.
type Ledger struct {
	pool *pgxpool.Pool
	sql  *statements
}

// New returns a Ledger for cfg.
func New(cfg Config) (*Ledger, error) {
	s, err := newStatements(cfg.Tables)
	if err != nil {
		return nil, err
	}
	return &Ledger{pool: cfg.Pool, sql: s}, nil
}

// recordSQL inserts the effect, or returns the row already recorded under its
// id; the last column says which. pg_notify is sent in the same round trip,
// so the dispatchers wake when the transaction commits.
const recordSQL = `WITH ins AS (
	INSERT INTO {ledger} (effect_id, effect_type, consumer, message_id, business_key, target,
		idempotency_key, request_hash, request, status, trace_context)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)
	ON CONFLICT (effect_id) DO NOTHING
	RETURNING {columns}
)
SELECT {columns}, true FROM ins
UNION ALL
SELECT {columns}, false FROM {ledger} WHERE effect_id = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// Record writes effect e into the open transaction tx and returns its entry.
// The dispatcher carries it out once tx commits; if tx rolls back, the effect
// never existed.
//
// Recording an effect id again with the same request is a no-op that returns
// the existing entry, whatever its status. With a different request it fails
// with an *EffectConflictError (errors.Is ErrEffectConflict) and tx stays
// usable.
//
// When ctx carries an idem.Deferred (the consumer runtime's batches without
// savepoints do), Record validates the effect and returns the entry it will
// write; the batch's effects are then written with one statement just before
// commit. If one of them conflicts with an effect recorded earlier, the
// runtime runs the batch again with immediate writes, and the conflict
// reaches the handler as above. The entry returned in deferred mode is the
// one being recorded (status pending or suppressed), not a stored one.
//
// Record keeps the trace context of the span in ctx (its W3C traceparent
// and tracestate) beside the effect, so that every attempt the dispatcher
// makes continues the trace of the request or message that recorded it.
// Recording an id again keeps the first trace context.
//
// The replay mode in ctx changes what Record does: idem.Rebuild writes the
// effect as StatusSuppressed (never dispatched); idem.Forensic writes nothing
// and adds the effect to the Capture from WithCapture, failing with
// ErrNoCapture when ctx has none.
func (l *Ledger) Record(ctx context.Context, tx pgx.Tx, e Effect) (Entry, error) {
	entry, err := prepare(e)
	if err != nil {
		return Entry{}, err
	}
	entry.TraceContext = tracing.Save(ctx)
	switch idem.ModeFrom(ctx) {
	case idem.Forensic:
		c := captureFrom(ctx)
		if c == nil {
			return Entry{}, fmt.Errorf("ledger: record %s: %w", entry.ID, ErrNoCapture)
		}
		return c.add(entry)
	case idem.Rebuild:
		entry.Status = StatusSuppressed
	}
	if d := idem.DeferredFrom(ctx); d != nil {
		pending := d.Use(l, func() idem.Flusher { return &pendingEffects{l: l} }).(*pendingEffects)
		return pending.add(entry)
	}

	b := &pgx.Batch{}
	var (
		got      Entry
		inserted bool
	)
	b.Queue(l.sql.record, entry.ID, entry.Type, entry.Consumer, entry.MessageID, entry.BusinessKey,
		entry.Target, entry.IdempotencyKey, entry.RequestHash[:], entry.Request, string(entry.Status),
		traceJSON(entry.TraceContext)).
		QueryRow(func(row pgx.Row) error {
			var err error
			got, err = scanEntry(extraColumn{row, &inserted})
			return err
		})
	if entry.Status == StatusPending {
		b.Queue("SELECT pg_notify($1, '')", l.sql.channel)
	}
	err = tx.SendBatch(ctx, b).Close()
	if errors.Is(err, pgx.ErrNoRows) {
		// Another transaction inserted the id after this statement's snapshot
		// was taken and committed while the insert waited for it.
		got, err = scanEntry(tx.QueryRow(ctx, l.sql.get, entry.ID))
	}
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: record %s: %w", entry.ID, err)
	}
	if got.RequestHash != entry.RequestHash {
		return Entry{}, &EffectConflictError{EffectID: entry.ID, Stored: got.RequestHash, Recorded: entry.RequestHash}
	}
	return got, nil
}

// prepare validates e and turns it into the entry Record would insert.
func prepare(e Effect) (Entry, error) {
	if e.Type == "" || e.BusinessKey == "" {
		return Entry{}, errors.New("ledger: effect needs a Type and a BusinessKey")
	}
	for _, s := range []string{e.Type, e.BusinessKey, e.Target, e.ID, e.Consumer, e.MessageID} {
		if strings.ContainsRune(s, 0) {
			return Entry{}, errors.New("ledger: effect fields must not contain NUL bytes")
		}
	}
	var req []byte
	switch r := e.Request.(type) {
	case json.RawMessage:
		req = r
	case []byte:
		req = r
	default:
		var err error
		if req, err = json.Marshal(r); err != nil {
			return Entry{}, fmt.Errorf("ledger: encode request of %s effect: %w", e.Type, err)
		}
	}
	if req == nil {
		req = []byte{}
	}
	id := e.ID
	if id == "" {
		id = EffectID(e.Type, e.BusinessKey)
	}
	return Entry{
		ID:             id,
		Type:           e.Type,
		BusinessKey:    e.BusinessKey,
		Target:         e.Target,
		Consumer:       e.Consumer,
		MessageID:      e.MessageID,
		IdempotencyKey: IdempotencyKey(id),
		RequestHash:    idem.HashBytes(req),
		Request:        req,
		Status:         StatusPending,
	}, nil
}

// traceJSON returns a trace context as the JSON text of the trace_context
// column, or nil (NULL) when there is none.
func traceJSON(m map[string]string) *string {
	if len(m) == 0 {
		return nil
	}
	b, _ := json.Marshal(m) // a map of strings always encodes
	s := string(b)
	return &s
}

// extraColumn scans entryColumns followed by one more column.
type extraColumn struct {
	row   pgx.Row
	extra any
}

func (r extraColumn) Scan(dest ...any) error { return r.row.Scan(append(dest, r.extra)...) }
