package deadletters

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/keyset"
)

// Record is one row of the dead-letter table: what an operator needs to
// answer "what happened to message X".
type Record struct {
	// ID is the row's id.
	ID int64
	// Consumer is the consumer that dead-lettered the message.
	Consumer string
	// MessageID is the message's id ("" when it had none).
	MessageID string
	// PayloadHash is the hash of the dead-lettered payload.
	PayloadHash idem.Hash
	// StoredHash is the inbox's hash for the id, for payload conflicts.
	StoredHash *idem.Hash
	// Reason is the dead-letter reason (payload_conflict, max_attempts, …).
	Reason string
	// Error is the handler error or cause, truncated.
	Error string
	// Source is the queue or stream; Exchange and RoutingKey the original route.
	Source, Exchange, RoutingKey string
	// Attempts is how many times the message was tried.
	Attempts int
	// Payload is the body, when the consumer stores payloads.
	Payload []byte
	// At is when the dead letter committed.
	At time.Time
	// RedrivenAt is when Redrive moved the message back to its queue; zero
	// when it was not.
	RedrivenAt time.Time
	// RedrivenBy is who redrove it, when known.
	RedrivenBy string
}

// Filter selects dead letters; zero fields match everything.
type Filter struct {
	// Consumer, MessageID and Reason match exactly when set.
	Consumer, MessageID, Reason string
	// Before continues a listing: only rows with an ID below it, the ID of
	// the last row of the page before (rows are listed newest first, by
	// ID). Zero starts with the newest.
	Before int64
	// Limit caps the rows returned, newest first. Default: 100.
	Limit int
}

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

const listColumns = `id, consumer, message_id, payload_hash, stored_hash, reason, error, source, exchange, routing_key,
	attempts, payload, dead_lettered_at, redriven_at, coalesce(redriven_by, '')`

// List returns a page of the dead letters in tables matching f, newest
// first: at most f.Limit. When it returns f.Limit rows, the next page is
// the rows before the last one's ID (Filter.Before).
func List(ctx context.Context, q Querier, tables idem.Tables, f Filter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var w keyset.Where
	order := ""
	switch {
	case f.MessageID != "": // a few rows: the (consumer, message_id) index
		w.Equal("consumer", f.Consumer)
		w.Equal("message_id", f.MessageID)
		w.Equal("reason", f.Reason)
	case f.Consumer != "": // the (consumer, id) index
		order = w.Leading("consumer", f.Consumer, true)
		w.Equal("reason", f.Reason)
	case f.Reason != "": // the (reason COLLATE "C", id) index
		order = w.Leading(`(reason COLLATE "C")`, f.Reason, true)
	}
	if f.Before > 0 {
		w.Add("id < " + w.Arg(f.Before))
	}
	sql := `SELECT ` + listColumns + ` FROM ` + tables.WithDefaults().Table("dead_letters") + w.SQL() +
		" ORDER BY " + order + "id DESC LIMIT " + w.Arg(f.Limit)
	rows, err := q.Query(ctx, sql, w.Args...)
	if err != nil {
		return nil, fmt.Errorf("deadletters: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanRecord)
	if err != nil {
		return nil, fmt.Errorf("deadletters: list: %w", err)
	}
	return out, nil
}

func scanRecord(r pgx.CollectableRow) (Record, error) {
	var (
		d            Record
		hash, stored []byte
		redrivenAt   *time.Time
	)
	if err := r.Scan(&d.ID, &d.Consumer, &d.MessageID, &hash, &stored, &d.Reason, &d.Error, &d.Source,
		&d.Exchange, &d.RoutingKey, &d.Attempts, &d.Payload, &d.At, &redrivenAt, &d.RedrivenBy); err != nil {
		return d, err
	}
	d.PayloadHash, _ = idem.HashFromBytes(hash)
	if h, err := idem.HashFromBytes(stored); err == nil {
		d.StoredHash = &h
	}
	if redrivenAt != nil {
		d.RedrivenAt = *redrivenAt
	}
	return d, nil
}
