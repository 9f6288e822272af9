package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
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
	// ChunkSize is how many rows each DELETE removes, each in its own
	// short transaction; the rows that share the receipt (received_at) of
	// the last of them go with it, so that the next chunk starts strictly
	// below that receipt. Default: DefaultChunkSize (1000).
	ChunkSize int
	// Consumer limits cleanup to one consumer. Default: every consumer.
	// The walk still reads the expired rows of every consumer once (the
	// table has no index by consumer and age).
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
	// PartitionsAhead is, on a partitioned inbox, how many partitions
	// after the one of now Cleanup makes (see EnsurePartitions). Default:
	// DefaultPartitionsAhead (4).
	PartitionsAhead int
}

// CleanupResult says what Cleanup did.
type CleanupResult struct {
	// Deleted is how many rows were deleted.
	Deleted int64
	// Chunks is how many DELETE statements deleted at least one row.
	Chunks int
	// Partitions is how many partitions of a partitioned inbox were
	// dropped; Deleted counts the rows they held.
	Partitions int
	// HeldPartitions is how many partitions wholly before the cutoff were
	// kept because they hold rows of a held scope.
	HeldPartitions int
}

const cutoffSQL = `SELECT now() - $1::bigint * interval '1 microsecond'`

// The chunk statement of Cleanup. It walks the rows down the received_at
// index, from the cutoff to the oldest, each chunk from below the receipt
// where the one before it stopped ($3), so that no chunk reads again the
// index entries of the rows the chunks before it deleted: they stay in the
// index until VACUUM, and VACUUM cannot remove them while a snapshot older
// than the deletion is open. Newest first, the first chunks meet the
// highest offsets and the newest sightings the horizon records; the chunks
// after them rarely move it, and a horizon that does not move is not
// written (see forgetSQL).
//
//   - next takes the next $2 rows of the walk, by nothing but their receipt:
//     an index range in index order with a limit, which the planner reads
//     as such whatever it estimates. (Filters in that scan would have it
//     estimate how many rows pass them; an anti-join against the holds was
//     estimated to keep one row, and had every chunk sort every expired row
//     left.)
//   - ties adds the other rows that share the receipt of the last of them
//     (rows claimed in one transaction share one receipt, and a bulk import
//     may give millions the same one), so that the next chunk starts
//     strictly below it.
//   - doomed locks, by row address, those whose message was last seen
//     (seen_at, or received_at when only one copy came) before the cutoff
//     ($1), of the consumer asked for ($4, all when NULL) and of no held
//     scope (%[3]s), skipping rows a running transaction holds locked
//     (cleanup never waits on a claim; a row updated since next read it has
//     a new address and waits for the next run).
//
// It returns how many rows next found (fewer than $2: the walk is over),
// how many the chunk deleted, and the receipt the next chunk starts below.
// In the same statement it records what each consumer forgot in the
// horizons table (%[2]s): the newest sighting and the highest offset of any
// copy among the deleted rows, per (consumer, source), which Horizon reads.
const (
	cleanupSQL = `WITH next AS (
	SELECT ctid, received_at FROM %[1]s WHERE received_at < $3 ORDER BY received_at DESC LIMIT $2
), ties AS (
	SELECT ctid FROM %[1]s WHERE received_at = (SELECT min(received_at) FROM next)
), doomed AS (
	SELECT ctid FROM %[1]s
	WHERE ctid = ANY (ARRAY(SELECT ctid FROM next UNION ALL SELECT ctid FROM ties))
		AND coalesce(seen_at, received_at) < $1
		AND ($4::text IS NULL OR consumer = $4::text)
		AND consumer <> ALL (ARRAY(SELECT consumer FROM %[3]s))
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING consumer, source, GREATEST(stream_offset, seen_offset) AS last_offset,
		coalesce(seen_at, received_at) AS last_seen
)` + forgetSQL + `
SELECT (SELECT count(*) FROM next), count(*), (SELECT min(received_at) FROM next) FROM gone`

	// forgetSQL records the horizon of the rows in gone: it raises each
	// (consumer, source)'s to cover them, and leaves alone, unwritten, a
	// horizon that covers them already. (Every write of a horizon leaves a
	// dead version of its row, which every later read of it reads again
	// while a snapshot older than the write is open.)
	forgetSQL = `, forgotten AS (
	INSERT INTO %[2]s AS h (consumer, source, forgotten_offset, forgotten_seen_at)
	SELECT consumer, source, max(last_offset), max(last_seen) FROM gone GROUP BY consumer, source
	ON CONFLICT (consumer, source) DO UPDATE SET
		forgotten_offset = GREATEST(h.forgotten_offset, EXCLUDED.forgotten_offset),
		forgotten_seen_at = GREATEST(h.forgotten_seen_at, EXCLUDED.forgotten_seen_at),
		updated_at = now()
	WHERE EXCLUDED.forgotten_seen_at > h.forgotten_seen_at
		OR GREATEST(h.forgotten_offset, EXCLUDED.forgotten_offset) IS DISTINCT FROM h.forgotten_offset
)`
)

// Cleanup deletes the rows whose message was last seen before
// opts.OlderThan, in chunks of opts.ChunkSize, each chunk a separate
// statement in its own transaction, so it never holds locks for long and can
// be interrupted (by ctx) at any point without losing work done. The cutoff
// is fixed when it starts; rows that expire meanwhile wait for the next run.
// It walks the rows from the newest expired receipt to the oldest, each
// chunk below the receipt where the one before it stopped, so the work
// grows with the rows deleted (and the held or recently seen rows passed
// on the way), not with their square, even while a snapshot older than the
// deletions is held open.
//
// A row counts from the last copy of its message that was claimed (see
// Claim), so a message that keeps coming back keeps its row. Scopes under a
// Hold (a running online rebuild's) are never touched. Each chunk records
// what it deleted as the consumer's horizon (see Horizon), in the same
// statement, so that replay and redrive refuse what could come back without
// its row.
//
// On an inbox laid out in time partitions (LayOutPartitioned), Cleanup
// deletes no row one by one: it makes the partitions ahead
// (EnsurePartitions), then drops every partition that ends before the
// cutoff and holds no row of a held scope, recording its horizon in the
// transaction that drops it; ChunkSize does not apply and Consumer is
// refused with ErrPartitioned.
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
		return res, fmt.Errorf("inbox: cleanup: %w: ChunkSize %d is negative", idem.ErrConfig, opts.ChunkSize)
	}
	if err := checkRetention(opts.OlderThan, opts.Floor); err != nil {
		return res, err
	}
	var cutoff time.Time
	if err := pool.QueryRow(ctx, ib.sql.cutoff, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return res, fmt.Errorf("inbox: cleanup: cutoff: %w", err)
	}
	if p, err := ib.readLayout(ctx, pool); err != nil {
		return res, err
	} else if p {
		return ib.cleanupPartitioned(ctx, pool, opts, cutoff)
	}
	err := cleanupChunks(ctx, pool, ib.sql.cleanup, opts, cutoff, &res)
	return res, err
}

// cleanupChunks runs the chunk statement stmt (cleanupSQL on a plain
// table) from the cutoff down, until the walk is over, and counts what it
// deleted in res.
func cleanupChunks(ctx context.Context, pool *pgxpool.Pool, stmt string, opts CleanupOptions, cutoff time.Time, res *CleanupResult) error {
	var consumer *string
	if opts.Consumer != "" {
		consumer = &opts.Consumer
	}
	// The receipt the walk has come down to: each chunk starts below it.
	below := pgtype.Timestamptz{Time: cutoff, Valid: true}
	for {
		var found, n int64
		err := pool.QueryRow(ctx, stmt, cutoff, opts.ChunkSize, below, consumer).Scan(&found, &n, &below)
		if err != nil {
			return fmt.Errorf("inbox: cleanup after %d rows: %w", res.Deleted, err)
		}
		if n > 0 {
			res.Deleted += n
			res.Chunks++
		}
		if found < int64(opts.ChunkSize) {
			return nil
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
	stmt := ib.sql.deleteScope
	if p, err := ib.readLayout(ctx, pool); err != nil {
		return 0, err
	} else if p {
		stmt = ib.sql.partitionDeleteScope
	}
	total, err := deleteInChunks(scopeChunk, func(after string) (n int64, last string, err error) {
		err = pool.QueryRow(ctx, stmt, consumer, after, scopeChunk).Scan(&n, &last)
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
