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
	// DefaultMinRetention is the shortest OlderThan Cleanup accepts unless
	// CleanupOptions.MinRetention lowers it.
	DefaultMinRetention = 72 * time.Hour
)

// CleanupOptions says which rows Cleanup deletes.
//
// Pick OlderThan longer than the longest time after which the same message
// can still arrive: the broker's redelivery horizon (unacked messages held
// through an outage, delayed retries, dead-letter queues shovelled back) and
// the replay horizon (how far back anyone may replay a stream into this
// consumer's scope). A row deleted too early turns the next delivery of its
// message into NewMessage, and the handler runs twice.
type CleanupOptions struct {
	// ChunkSize is how many rows each DELETE removes; each runs as its own
	// short transaction. Default: DefaultChunkSize (1000).
	ChunkSize int
	// Consumer limits cleanup to one consumer. Default: every consumer.
	Consumer string
	// MinRetention is the floor below which OlderThan is refused with
	// ErrRetentionTooShort, a guard against typos such as 168m for 168h.
	// Default: DefaultMinRetention (72h).
	MinRetention time.Duration
	// OlderThan deletes rows received longer ago than this, measured by the
	// database clock when Cleanup starts. Required.
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

// The chunk statements pick row versions by ctid, skipping rows that a
// running transaction has locked, so cleanup never waits on live claims. In
// the same statement they record what the consumer forgot in the horizons
// table (%[2]s): the highest stream offset and the newest receipt deleted
// per (consumer, source), which Horizon reads.
const (
	cleanupSQL = `WITH gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE received_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))
	RETURNING consumer, source, stream_offset, received_at
)` + forgetSQL
	cleanupConsumerSQL = `WITH gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE received_at < $1 AND consumer = $3 LIMIT $2 FOR UPDATE SKIP LOCKED))
	RETURNING consumer, source, stream_offset, received_at
)` + forgetSQL
	forgetSQL = `, forgotten AS (
	INSERT INTO %[2]s AS h (consumer, source, forgotten_offset, forgotten_received_at)
	SELECT consumer, source, max(stream_offset), max(received_at) FROM gone GROUP BY consumer, source
	ON CONFLICT (consumer, source) DO UPDATE SET
		forgotten_offset = GREATEST(h.forgotten_offset, EXCLUDED.forgotten_offset),
		forgotten_received_at = GREATEST(h.forgotten_received_at, EXCLUDED.forgotten_received_at),
		updated_at = now()
)
SELECT count(*) FROM gone`
)

// Cleanup deletes rows older than opts.OlderThan in chunks of
// opts.ChunkSize, each chunk a separate statement in its own transaction, so
// it never holds locks for long and can be interrupted (by ctx) at any point
// without losing work done. The cutoff is fixed when it starts; rows that
// expire meanwhile wait for the next run.
//
// Each chunk also records what it deleted as the consumer's horizon (see
// Horizon), so that a normal replay can refuse to start where the inbox no
// longer remembers what was applied.
//
// Run it periodically: the retention package cleans every table of idem in
// the same way, from `idem cleanup` or in-process on a schedule.
func (ib *Inbox) Cleanup(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions) (CleanupResult, error) {
	if opts.ChunkSize == 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	if opts.MinRetention == 0 {
		opts.MinRetention = DefaultMinRetention
	}
	var res CleanupResult
	if opts.ChunkSize < 0 {
		return res, &ValidationError{Field: "ChunkSize", Err: ErrInvalidField, Detail: fmt.Sprintf("%d is negative", opts.ChunkSize)}
	}
	if err := checkRetention(opts.OlderThan, opts.MinRetention); err != nil {
		return res, err
	}
	var cutoff time.Time
	if err := pool.QueryRow(ctx, ib.sql.cutoff, opts.OlderThan.Microseconds()).Scan(&cutoff); err != nil {
		return res, fmt.Errorf("inbox: cleanup: cutoff: %w", err)
	}
	for {
		var err error
		var n int64
		if opts.Consumer == "" {
			err = pool.QueryRow(ctx, ib.sql.cleanup, cutoff, opts.ChunkSize).Scan(&n)
		} else {
			err = pool.QueryRow(ctx, ib.sql.cleanupConsumer, cutoff, opts.ChunkSize, opts.Consumer).Scan(&n)
		}
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
