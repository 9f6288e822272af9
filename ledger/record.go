package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tracing"
)

// Config configures a Ledger.
type Config struct {
	// MeterProvider provides the meter of Record's counter
	// idem.ledger.effects.suppressed. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Pool is used by the operator functions (List, Get, Resolve, Stats).
	// Record uses the caller's transaction and does not need it. Optional.
	Pool *pgxpool.Pool
	// Tables says where the ledger's tables live. Default: idem's defaults.
	Tables idem.Tables
}

// Ledger records effects inside the caller's transactions and answers
// operators' questions about them. It is safe for concurrent use.
type Ledger struct {
	pool    *pgxpool.Pool
	sql     *statements
	metrics *recordMetrics
}

// New returns a Ledger for cfg.
func New(cfg Config) (*Ledger, error) {
	s, err := newStatements(cfg.Tables)
	if err != nil {
		return nil, err
	}
	m, err := newRecordMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("ledger: metrics: %w", err)
	}
	return &Ledger{pool: cfg.Pool, sql: s, metrics: m}, nil
}

// recordSQL inserts the effect, or returns the row already recorded under its
// id; the next to last column says which. An effect whose id has a
// tombstone (its settled row was removed by retention) is inserted as
// suppressed, with a note, in the same statement: one probe of the
// tombstones' primary key. The last column says whether the statement's
// snapshot held a row under the id: inserted all the same, the row was
// deleted since, and Record sends guardSQL.
const recordSQL = `WITH gone AS (
	SELECT ` + tombstoneNote + ` AS note FROM {tombstones} AS t WHERE t.effect_id = $1
), ins AS (
	INSERT INTO {ledger} (effect_id, effect_type, consumer, message_id, business_key, target,
		idempotency_key, request_hash, request, status, last_error, trace_context)
	SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::bytea, $9::bytea,
		CASE WHEN gone.note IS NULL THEN $10::text ELSE 'suppressed' END, coalesce(gone.note, ''), $11::jsonb
	FROM (VALUES (1)) AS one LEFT JOIN gone ON true
	ON CONFLICT (effect_id) DO NOTHING
	RETURNING {columns}
)
SELECT {columns}, true, EXISTS (SELECT 1 FROM {ledger} WHERE effect_id = $1) FROM ins
UNION ALL
SELECT {columns}, false, true FROM {ledger} WHERE effect_id = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// Record writes effect e into the open transaction tx and returns its entry.
// The dispatcher carries it out once tx commits; if tx rolls back, the effect
// never existed.
//
// Recording an effect id again with the same request is a no-op that returns
// the existing entry, whatever its status. With a different request it fails
// with an *EffectConflictError (errors.Is ErrEffectConflict) and tx stays
// usable.
//
// Recording an effect id that retention forgot is never sent: when
// retention deletes a settled effect it leaves a tombstone (see
// DeleteSettled), and an effect recorded again under that id, by a repair,
// a rebuild, a redrive or a producer after the ledger's horizon, is written
// as StatusSuppressed with a LastError that says how and when it settled
// before, and counted by the idem.ledger.effects.suppressed counter (reason
// "tombstone"). The tombstone is probed in the statement that inserts the
// effect: no extra round trip.
//
// When ctx carries an idem.Deferred (the consumer runtime's batches without
// savepoints do), Record validates the effect and returns the entry it will
// write; the batch's effects are then written with one statement just before
// commit. If one of them conflicts with an effect recorded earlier, the
// runtime runs the batch again with immediate writes, and the conflict
// reaches the handler as above. The entry returned in deferred mode is the
// one being recorded (status pending or suppressed), not a stored one: an
// effect with a tombstone is written as suppressed all the same.
//
// Record keeps the trace context of the span in ctx (its W3C traceparent
// and tracestate) beside the effect, so that every attempt the dispatcher
// makes continues the trace of the request or message that recorded it.
// Recording an id again keeps the first trace context.
//
// The replay mode in ctx changes what Record does: idem.Rebuild writes the
// effect as StatusSuppressed (never dispatched; counted with reason
// "rebuild"); idem.Forensic writes nothing and adds the effect to the
// Capture from WithCapture, failing with ErrNoCapture when ctx has none.
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
	got, inserted, err := l.insert(ctx, tx, entry)
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: record %s: %w", entry.ID, err)
	}
	if got.RequestHash != entry.RequestHash {
		return Entry{}, &EffectConflictError{EffectID: entry.ID, Stored: got.RequestHash, Recorded: entry.RequestHash}
	}
	if inserted && got.Status == StatusSuppressed {
		l.metrics.suppress(ctx, got.Type, suppressReason(entry.Status), 1)
	}
	return got, nil
}

// insert writes entry, or reads the row recorded before under its id, in
// one round trip; inserted says which. It wakes the dispatchers for a
// pending entry in the same round trip.
func (l *Ledger) insert(ctx context.Context, tx pgx.Tx, entry Entry) (got Entry, inserted bool, err error) {
	var seen bool
	b := &pgx.Batch{}
	b.Queue(l.sql.record, entry.ID, entry.Type, entry.Consumer, entry.MessageID, entry.BusinessKey,
		entry.Target, entry.IdempotencyKey, entry.RequestHash[:], entry.Request, string(entry.Status),
		traceJSON(entry.TraceContext)).
		QueryRow(func(row pgx.Row) error {
			var err error
			got, err = scanEntry(extraColumns{row, []any{&inserted, &seen}})
			return err
		})
	if entry.Status == StatusPending {
		b.Queue("SELECT pg_notify($1, '')", l.sql.channel)
	}
	err = tx.SendBatch(ctx, b).Close()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Another transaction inserted the id after this statement's snapshot
		// was taken and committed while the insert waited for it.
		got, err = scanEntry(tx.QueryRow(ctx, l.sql.get, entry.ID))
	case err == nil && inserted && seen && got.Status == StatusPending:
		got, err = l.guard(ctx, tx, got)
	}
	return got, inserted, err
}

// guard suppresses the pending entry got, just inserted, if retention
// deleted the row its statement's snapshot held under the same id and
// committed the tombstone while the insert ran (see guardSQL).
func (l *Ledger) guard(ctx context.Context, tx pgx.Tx, got Entry) (Entry, error) {
	guarded, err := scanEntry(tx.QueryRow(ctx, l.sql.guard, got.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return got, nil // no tombstone: deleted by other means
	}
	return guarded, err
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

// extraColumns scans entryColumns followed by more columns.
type extraColumns struct {
	row   pgx.Row
	extra []any
}

func (r extraColumns) Scan(dest ...any) error { return r.row.Scan(append(dest, r.extra...)...) }
