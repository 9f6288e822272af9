package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A transfer makes one scope (To, the live consumer) know exactly the
// messages another scope (From, an online rebuild's own) applied, so that a
// message delivered again after the rebuild's tables replace the live ones
// is a duplicate if and only if those tables hold it.
//
// Comparing two scopes reads every row, so it is split: Differences lists,
// before the live consumer is paused, the ids that differ up to an offset
// neither scope claims again; Transfer applies them (and the ids of the
// messages the pause applied) by id, inside the pause.
const (
	// forgetDiffSQL lists To's rows from source $3 up to offset $4 that
	// From does not hold.
	forgetDiffSQL = `SELECT l.message_id FROM %[1]s AS l
WHERE l.consumer = $1 AND l.source = $3 AND l.stream_offset <= $4
	AND NOT EXISTS (SELECT 1 FROM %[1]s AS s WHERE s.consumer = $2 AND s.message_id = l.message_id)`
	// learnDiffSQL lists From's rows above To's horizon ($4) up to $3 that
	// To lacks or holds with another payload.
	learnDiffSQL = `SELECT s.message_id FROM %[1]s AS s
WHERE s.consumer = $2 AND s.stream_offset <= $3 AND s.stream_offset > $4
	AND NOT EXISTS (SELECT 1 FROM %[1]s AS l
		WHERE l.consumer = $1 AND l.message_id = s.message_id AND l.payload_hash = s.payload_hash)`
	// transferForgetSQL deletes To's rows of ids $3 that From does not
	// hold, and records what To forgot in its horizon as Cleanup does.
	transferForgetSQL = `WITH gone AS (
	DELETE FROM %[1]s AS l WHERE l.consumer = $1 AND l.message_id = ANY($3::text[])
		AND NOT EXISTS (SELECT 1 FROM %[1]s AS s WHERE s.consumer = $2 AND s.message_id = l.message_id)
	RETURNING l.consumer, l.source, GREATEST(l.stream_offset, l.seen_offset) AS last_offset,
		coalesce(l.seen_at, l.received_at) AS last_seen
)` + forgetSQL + `
SELECT count(*) FROM gone`
	// transferLearnSQL copies From's rows of ids $3 above To's horizon ($4)
	// that To lacks or holds with another payload.
	transferLearnSQL = `INSERT INTO %[1]s AS l (consumer, message_id, payload_hash, business_key, source, stream_offset, received_at,
	seen_at, seen_offset)
SELECT $1, s.message_id, s.payload_hash, s.business_key, s.source, s.stream_offset, s.received_at, s.seen_at, s.seen_offset
FROM %[1]s AS s
WHERE s.consumer = $2 AND s.message_id = ANY($3::text[]) AND (s.stream_offset IS NULL OR s.stream_offset > $4)
	AND NOT EXISTS (SELECT 1 FROM %[1]s AS x
		WHERE x.consumer = $1 AND x.message_id = s.message_id AND x.payload_hash = s.payload_hash)
ON CONFLICT (consumer, message_id) DO UPDATE SET payload_hash = EXCLUDED.payload_hash,
	business_key = EXCLUDED.business_key, source = EXCLUDED.source, stream_offset = EXCLUDED.stream_offset,
	seen_at = EXCLUDED.seen_at, seen_offset = EXCLUDED.seen_offset`
)

// Transfer says what Transfer changes in scope To.
type Transfer struct {
	// From is the scope whose rows are the truth; To is the scope that
	// takes them.
	From, To string
	// Forget are ids To holds and From may not: those From does not hold
	// are deleted from To, and To's horizon records them.
	Forget []string
	// Learn are ids From holds and To may lack or hold with another
	// payload: those are copied to To, unless at or below ForgottenUpTo.
	Learn []string
	// ForgottenUpTo is To's horizon on the stream (-1 for none): rows
	// retention made To forget stay forgotten.
	ForgottenUpTo int64
}

// Differences lists, for a Transfer, the ids that differ between scope to
// and scope from among the messages of stream source up to offset upTo:
// forget holds to's rows that from lacks, learn from's rows above
// forgottenUpTo that to lacks or holds with another payload.
func (ib *Inbox) Differences(ctx context.Context, q Querier, from, to, source string, upTo, forgottenUpTo int64) (forget, learn []string, err error) {
	if forget, err = ids(ctx, q, ib.sql.forgetDiff, to, from, source, upTo); err != nil {
		return nil, nil, err
	}
	if learn, err = ids(ctx, q, ib.sql.learnDiff, to, from, upTo, forgottenUpTo); err != nil {
		return nil, nil, err
	}
	return forget, learn, nil
}

// Transfer applies t in tx: one statement deletes t.Forget's rows that
// t.From does not hold from t.To and records t.To's horizon, another copies
// t.Learn's rows.
//
// A partitioned inbox refuses it with ErrPartitioned.
func (ib *Inbox) Transfer(ctx context.Context, tx pgx.Tx, t Transfer) error {
	// Read afresh: the inbox may have been converted since this Inbox
	// last read its layout.
	if p, err := ib.readLayout(ctx, tx); err != nil {
		return err
	} else if p {
		return fmt.Errorf("inbox: transfer %q to %q: %w", t.From, t.To, ErrPartitioned)
	}
	b := &pgx.Batch{}
	b.Queue(ib.sql.transferForget, t.To, t.From, t.Forget)
	b.Queue(ib.sql.transferLearn, t.To, t.From, t.Learn, t.ForgottenUpTo)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("inbox: transfer %q to %q: %w", t.From, t.To, err)
	}
	return nil
}

// ids runs a query that lists message ids.
func ids(ctx context.Context, q Querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: compare scopes: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: compare scopes: %w", err)
	}
	return out, nil
}
