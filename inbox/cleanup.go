package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Cleanup defaults.
const (
	// DefaultChunkSize is how many rows one cleanup statement deletes.
	DefaultChunkSize = 1000
	// DefaultFloor is the shortest OlderThan Cleanup accepts unless
	// CleanupOptions.Floor says otherwise: seven days. The retention
	// package and both cleanup commands of idem use the same floor.
	DefaultFloor = 7 * 24 * time.Hour
)

// CleanupOptions says which rows Cleanup deletes.
//
// Pick OlderThan longer than the longest time after which the same message
// can still arrive: the broker's redelivery horizon (unacked messages held
// through an outage, delayed retries, dead-letter queues shovelled back) and
// the replay horizon (how far back anyone may replay a stream into this
// consumer's scope). A row deleted too early turns the next delivery of its
// message into NewMessage, and the handler runs twice; the doors that know
// when a message last came (replay, redrive) ask Horizon and refuse it.
type CleanupOptions struct {
	// ChunkSize is how many rows each DELETE removes; each runs as its own
	// short transaction. Default: DefaultChunkSize (1000).
	ChunkSize int
	// Consumer limits cleanup to one consumer. Default: every consumer.
	Consumer string
	// Floor is the shortest OlderThan accepted; a shorter one is refused
	// with ErrRetentionTooShort before anything is deleted. It guards
	// against typos such as 168m for 168h and against a retention shorter
	// than the redelivery and replay horizons. Default: DefaultFloor (7
	// days).
	Floor time.Duration
	// OlderThan deletes rows whose message was last seen longer ago than
	// this, measured by the database clock when Cleanup starts. Required.
	OlderThan time.Duration
}

// CleanupResult says what Cleanup did.
type CleanupResult struct {
	// Deleted is how many rows were deleted.
	Deleted int64
	// Chunks is how many DELETE statements deleted at least one row.
	Chunks int
}

const cutoffSQL = `SELECT now() - $1::bigint * interval '1 microsecond'`

// The chunk statement of Cleanup. It walks the rows by received_at from a
// bound ($3) that each chunk advances to the newest receipt it deleted, so
// that no chunk reads again the index entries of the rows the chunks before
// it deleted (they stay in the index until VACUUM). A row goes when its
// message was last seen (seen_at, or received_at when only one copy came)
// before the cutoff, unless its scope is held (%[3]s) or a running
// transaction holds it locked (SKIP LOCKED: cleanup never waits on a claim).
// In the same statement it records what each consumer forgot in the
// horizons table (%[2]s): the newest sighting and the highest offset of any
// copy among the deleted rows, per (consumer, source), which Horizon reads.
const (
	cleanupSQL = `WITH doomed AS (
	SELECT ctid FROM %[1]s AS t
	WHERE received_at >= $3 AND received_at < $1 AND coalesce(seen_at, received_at) < $1
		AND ($4::text IS NULL OR consumer = $4::text)
		AND NOT EXISTS (SELECT 1 FROM %[3]s AS h WHERE h.consumer = t.consumer)
	ORDER BY received_at LIMIT $2
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING consumer, source, GREATEST(stream_offset, seen_offset) AS last_offset,
		coalesce(seen_at, received_at) AS last_seen, received_at
)` + forgetSQL + `
SELECT count(*), coalesce(max(received_at), $3) FROM gone`

	// forgetSQL records the horizon of the rows in gone.
	forgetSQL = `, forgotten AS (
	INSERT INTO %[2]s AS h (consumer, source, forgotten_offset, forgotten_seen_at)
	SELECT consumer, source, max(last_offset), max(last_seen) FROM gone GROUP BY consumer, source
	ON CONFLICT (consumer, source) DO UPDATE SET
		forgotten_offset = GREATEST(h.forgotten_offset, EXCLUDED.forgotten_offset),
		forgotten_seen_at = GREATEST(h.forgotten_seen_at, EXCLUDED.forgotten_seen_at),
		updated_at = now()
)`
)

// Cleanup deletes the rows whose message was last seen before
// opts.OlderThan, in chunks of opts.ChunkSize, each chunk a separate
// statement in its own transaction, so it never holds locks for long and can
// be interrupted (by ctx) at any point without losing work done. The cutoff
// is fixed when it starts; rows that expire meanwhile wait for the next run.
// Each chunk starts where the one before it stopped, so the work grows with
// the rows deleted, not with their square.
//
// A row counts from the last copy of its message that was claimed (see
// Claim), so a message that keeps coming back keeps its row. Scopes under a
// Hold (a running online rebuild's) are never touched. Each chunk records
// what it deleted as the consumer's horizon (see Horizon), in the same
// statement, so that replay and redrive refuse what could come back without
// its row.
//
// Run it periodically: the retention package cleans every table of idem in
// the same way, from `idem cleanup` or in-process on a schedule.
func (ib *Inbox) Cleanup(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions) (CleanupResult, error) {
	if opts.ChunkSize == 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if opts.Floor == 0 {
		opts.Floor = DefaultFloor
	}
	var res CleanupResult
	if opts.ChunkSize < 0 {
		return res, &ValidationError{Field: "ChunkSize", Err: ErrInvalidField, Detail: fmt.Sprintf("%d is negative", opts.ChunkSize)}
	}
	if err := checkRetention(opts.OlderThan, opts.Floor); err != nil {
		return res, err
	}
	var cutoff time.Time
	if err := pool.QueryRow(ctx, ib.sql.cutoff, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return res, fmt.Errorf("inbox: cleanup: cutoff: %w", err)
	}
	var consumer *string
	if opts.Consumer != "" {
		consumer = &opts.Consumer
	}
	from := time.Time{} // the oldest receipt a chunk may still find
	for {
		var n int64
		err := pool.QueryRow(ctx, ib.sql.cleanup, cutoff, opts.ChunkSize, from, consumer).Scan(&n, &from)
		if err != nil {
			return res, fmt.Errorf("inbox: cleanup after %d rows: %w", res.Deleted, err)
		}
		if n > 0 {
			res.Deleted += n
			res.Chunks++
		}
		if n < int64(opts.ChunkSize) {
			return res, nil
		}
	}
}

// scopeChunk is how many rows one statement of DeleteScope deletes.
const scopeChunk = 5000

// deleteScopeSQL deletes one chunk of a scope's rows in key order, from
// after the last message id the chunk before it deleted ($2), and returns
// how many it deleted and the last id.
const deleteScopeSQL = `WITH gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE consumer = $1 AND message_id > $2 ORDER BY message_id LIMIT $3))
	RETURNING message_id
)
SELECT count(*), coalesce(max(message_id), $2) FROM gone`

// DeleteScope deletes every row of consumer, whatever its age, in chunks of
// 5,000 rows in key order, each its own statement: a scope that is no
// longer needed (an online rebuild's own scope after its swap or when it is
// abandoned). Each chunk starts after the last key the one before it
// deleted, so the time grows with the rows, never rereading the index
// entries of rows already gone. It records no horizon: nothing is consumed
// under a dropped scope again. A scope under a Hold is refused with
// ErrHeld; release it first.
func (ib *Inbox) DeleteScope(ctx context.Context, pool *pgxpool.Pool, consumer string) (int64, error) {
	if err := ib.validateKey(0, consumer, "-"); err != nil {
		return 0, err
	}
	switch held, err := ib.Held(ctx, pool, consumer); {
	case err != nil:
		return 0, err
	case held:
		return 0, fmt.Errorf("inbox: delete the rows of %q: %w", consumer, ErrHeld)
	}
	total, err := deleteInChunks(scopeChunk, func(after string) (n int64, last string, err error) {
		err = pool.QueryRow(ctx, ib.sql.deleteScope, consumer, after, scopeChunk).Scan(&n, &last)
		return n, last, err
	})
	if err != nil {
		return total, fmt.Errorf("inbox: delete the rows of %q after %d: %w", consumer, total, err)
	}
	return total, nil
}

// deleteInChunks runs chunk, which deletes up to size rows after a key and
// returns how many it deleted and the last key, from the first key on and
// then each time from the last key the call before returned, until a call
// deletes fewer than size rows; it returns the rows deleted.
func deleteInChunks(size int64, chunk func(after string) (int64, string, error)) (int64, error) {
	var total int64
	after := ""
	for {
		n, last, err := chunk(after)
		if err != nil {
			return total, err
		}
		total += n
		if n < size {
			return total, nil
		}
		after = last
	}
}
