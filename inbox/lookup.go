package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rowcount"
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
	// Rows is how many messages the inbox holds for it: exact below a
	// thousand, else the planner's estimate (Estimated).
	Rows int64
	// Estimated reports that Rows is the planner's estimate: the table's
	// statistics (its last ANALYZE, scaled to its size now) put the
	// consumer at a thousand rows or more.
	Estimated bool
	// Oldest is the earliest ReceivedAt, and Newest the latest, when Rows
	// is exact; zero when it is an estimate.
	Oldest, Newest time.Time
}

const lookupSQL = `SELECT consumer, message_id, payload_hash, coalesce(business_key, ''), source, stream_offset, received_at,
	seen_at, seen_offset
FROM %[1]s WHERE consumer = $1 AND message_id = $2`

// consumersSQL lists the consumers with rows, in order, skipping from one
// to the next in the primary key: one index descent per consumer, however
// many rows each has.
const consumersSQL = `WITH RECURSIVE c AS (
	(SELECT consumer FROM %[1]s ORDER BY consumer LIMIT 1)
	UNION ALL
	SELECT (SELECT consumer FROM %[1]s AS i WHERE i.consumer > c.consumer ORDER BY consumer LIMIT 1)
	FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL`

// consumerRowsSQL counts consumer $1's rows and their age range, reading
// at most $2 of them through the primary key.
const consumerRowsSQL = `SELECT count(*), coalesce(min(received_at), 'epoch'), coalesce(max(received_at), 'epoch')
FROM (SELECT received_at FROM %[1]s WHERE consumer = $1 LIMIT $2) AS capped`

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

// Stats returns the rows of every consumer with rows, ordered by
// consumer. Its work follows the consumers, not the rows: a consumer with
// fewer than a thousand rows is counted exactly, one with more is the
// planner's estimate (ConsumerStats.Estimated); in the partitioned layout,
// the sum of its partitions' estimates, since autovacuum analyses the
// partitions and never their parent. Without statistics (a table or every
// partition never analysed) a consumer with a thousand rows or more shows
// a thousand, marked estimated: run ANALYZE on the inbox for an estimate.
func (ib *Inbox) Stats(ctx context.Context, q Querier) ([]ConsumerStats, error) {
	rows, err := q.Query(ctx, ib.sql.consumers)
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	planner, err := rowcount.ReadStats(ctx, q, ib.sql.table, "consumer")
	if err != nil {
		return nil, fmt.Errorf("inbox: stats: %w", err)
	}
	out := make([]ConsumerStats, 0, len(names))
	for _, name := range names {
		s := ConsumerStats{Consumer: name}
		c, err := planner.Of(ctx, name, func(ctx context.Context, limit int) (int64, error) {
			var n int64
			err := q.QueryRow(ctx, ib.sql.consumerRows, name, limit).Scan(&n, &s.Oldest, &s.Newest)
			return n, err
		})
		if err != nil {
			return nil, fmt.Errorf("inbox: stats: consumer %q: %w", name, err)
		}
		s.Rows, s.Estimated = c.N, c.Estimated
		if s.Estimated {
			s.Oldest, s.Newest = time.Time{}, time.Time{}
		}
		out = append(out, s)
	}
	return out, nil
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
