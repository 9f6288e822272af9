package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Record is one inbox row: a message a consumer committed.
type Record struct {
	// Consumer is the consumer that claimed the message.
	Consumer string
	// MessageID is the message's id; with Consumer, the row's key.
	MessageID string
	// PayloadHash is the hash the message was claimed with.
	PayloadHash idem.Hash
	// BusinessKey is the claim's business key, "" if none.
	BusinessKey string
	// Source is the queue or stream the message came from.
	Source string
	// StreamOffset is the stream offset, nil for queues.
	StreamOffset *int64
	// ReceivedAt is when the claiming transaction began (its now()).
	ReceivedAt time.Time
	// SeenAt is when a later copy of the message was last claimed (a
	// duplicate or a conflicting payload); nil when only one copy came.
	// Retention counts a row's age from it.
	SeenAt *time.Time
	// SeenOffset is the highest stream offset of any later copy; nil when
	// only one copy came, and for queues.
	SeenOffset *int64
}

// ConsumerStats summarises one consumer's rows.
type ConsumerStats struct {
	// Consumer is the consumer's name.
	Consumer string
	// Rows is how many messages the inbox holds for it.
	Rows int64
	// Oldest is the earliest ReceivedAt.
	Oldest time.Time
	// Newest is the latest ReceivedAt.
	Newest time.Time
}

const lookupSQL = `SELECT consumer, message_id, payload_hash, coalesce(business_key, ''), source, stream_offset, received_at,
	seen_at, seen_offset
FROM %[1]s WHERE consumer = $1 AND message_id = $2`

const statsSQL = `SELECT consumer, count(*), min(received_at), max(received_at)
FROM %[1]s GROUP BY consumer ORDER BY consumer`

// Lookup returns the row for (consumer, messageID), or an error matching
// ErrNotFound. It is what `idem inbox show` prints.
func (ib *Inbox) Lookup(ctx context.Context, q Querier, consumer, messageID string) (Record, error) {
	var r Record
	var hash []byte
	err := q.QueryRow(ctx, ib.sql.lookup, consumer, messageID).Scan(
		&r.Consumer, &r.MessageID, &hash, &r.BusinessKey, &r.Source, &r.StreamOffset, &r.ReceivedAt, &r.SeenAt, &r.SeenOffset)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("inbox: lookup %q for consumer %q: %w", messageID, consumer, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("inbox: lookup %q: %w", messageID, err)
	}
	if r.PayloadHash, err = idem.HashFromBytes(hash); err != nil {
		return Record{}, fmt.Errorf("inbox: lookup %q: %w", messageID, err)
	}
	return r, nil
}

// Stats returns the row count and age range of every consumer with rows,
// ordered by consumer. It scans the whole table; it is meant for operators,
// not for a hot path.
func (ib *Inbox) Stats(ctx context.Context, q Querier) ([]ConsumerStats, error) {
	rows, err := q.Query(ctx, ib.sql.stats)
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConsumerStats, error) {
		var s ConsumerStats
		err := row.Scan(&s.Consumer, &s.Rows, &s.Oldest, &s.Newest)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	return stats, nil
}

// LookupClaims decides claims as Claim would, without claiming: each one
// is looked up, in a read-only transaction say, and is NewMessage when the
// inbox holds no row for it. Nothing is written, no sighting recorded.
func (ib *Inbox) LookupClaims(ctx context.Context, q Querier, claims []Claim) ([]Result, error) {
	out := make([]Result, len(claims))
	for i, c := range claims {
		rec, err := ib.Lookup(ctx, q, c.Consumer, c.MessageID)
		switch {
		case errors.Is(err, ErrNotFound):
			out[i] = Result{Decision: NewMessage, StoredHash: c.PayloadHash}
		case err != nil:
			return nil, err
		default:
			out[i] = decide(c.PayloadHash, rec.PayloadHash)
		}
	}
	return out, nil
}
