package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// partitionSummarySQL reads what dropping a partition makes each
	// (consumer, source) forget: the highest offset and the newest
	// sighting of its rows, and how many rows it holds. It reads the
	// partition once, before the transaction that drops it, so that no
	// claim waits on that read.
	partitionSummarySQL = `SELECT consumer, source, max(GREATEST(stream_offset, seen_offset)),
	max(coalesce(seen_at, received_at)), count(*)
FROM %s GROUP BY consumer, source`
	// heldInSQL reports whether the partition %[1]s holds a row of a held
	// scope: a probe of its index per hold, so that a partition kept for a
	// hold is not read whole at every cleanup.
	heldInSQL = `SELECT EXISTS (SELECT FROM %[2]s AS h WHERE EXISTS (SELECT FROM %[1]s AS p WHERE p.consumer = h.consumer))`
	// heldAmongSQL reports whether any of the consumers $1 is held.
	heldAmongSQL = `SELECT EXISTS (SELECT FROM %[3]s WHERE consumer = ANY ($1::text[]))`
	// forgetPartitionSQL records the horizon of a dropped partition's rows,
	// as Cleanup's chunks record theirs (forgetSQL).
	forgetPartitionSQL = `WITH gone AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[]) AS g(consumer, source, last_offset, last_seen)
)` + forgetSQL + `
SELECT count(*) FROM gone`
)

// partitionSummary is what a partition holds, per (consumer, source).
type partitionSummary struct {
	consumers, sources []string
	offsets            []*int64
	seen               []time.Time
	rows               int64
}

// cleanupPartitioned is Cleanup on a partitioned inbox: it makes the
// partitions ahead (EnsurePartitions), then drops, oldest first, every
// partition that lies wholly before cutoff and holds no row of a held
// scope. A row's partition is that of its last sighting, so every row of
// such a partition was last seen before the cutoff. It deletes no row one
// by one.
func (ib *Inbox) cleanupPartitioned(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions, cutoff time.Time) (CleanupResult, error) {
	var res CleanupResult
	if opts.Consumer != "" {
		return res, fmt.Errorf("inbox: cleanup of consumer %q: %w: a partition holds every consumer's rows", opts.Consumer, ErrPartitioned)
	}
	if _, err := ib.EnsurePartitions(ctx, pool, opts.PartitionsAhead); err != nil {
		return res, fmt.Errorf("inbox: cleanup: %w", err)
	}
	width, err := ib.partitionWidth(ctx, pool)
	if err != nil {
		return res, err
	}
	starts, err := ib.partitions(ctx, pool)
	if err != nil {
		return res, err
	}
	if err := ib.cleanupLegacy(ctx, pool, opts, cutoff, &res); err != nil {
		return res, err
	}
	w := int64(width / time.Second)
	for _, s := range starts {
		if s+w > cutoff.Unix() {
			break
		}
		name, table := ib.partition(s)
		n, dropped, err := ib.dropPartition(ctx, pool, name, table, false)
		if err != nil {
			return res, fmt.Errorf("inbox: cleanup after %d partitions: %w", res.Partitions, err)
		}
		if !dropped {
			res.HeldPartitions++
			continue
		}
		res.Deleted += n
		res.Partitions++
	}
	return res, nil
}

// cleanupLegacy cleans the legacy partition of an inbox converted online
// (see ConvertPartitioned), when it has one: it drops it whole once every
// time it covers is before the cutoff (and no held scope has a row in it),
// and deletes its expired rows in chunks, as Cleanup does on a plain
// table, until then.
func (ib *Inbox) cleanupLegacy(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions, cutoff time.Time, res *CleanupResult) error {
	until, err := ib.legacyUntil(ctx, pool)
	if err != nil || until == 0 {
		return err
	}
	name, table := ib.legacy()
	if until <= cutoff.Unix() {
		n, dropped, err := ib.dropPartition(ctx, pool, name, table, true)
		if err != nil {
			return fmt.Errorf("inbox: cleanup: %w", err)
		}
		if dropped {
			res.Deleted += n
			res.Partitions++
			return nil
		}
		res.HeldPartitions++
	}
	stmt := fmt.Sprintf(cleanupSQL, table, ib.tables.Table("inbox_horizons"), ib.tables.Table("inbox_holds"))
	return cleanupChunks(ctx, pool, stmt, opts, cutoff, res)
}

// dropPartition drops the partition name (table, quoted) and records, in
// the same transaction, the horizon of its rows; it returns how many rows
// the partition held. A partition holding a row of a held scope is kept
// (dropped is false) until the hold is released. Dropping the legacy
// partition clears its bound from the layout.
func (ib *Inbox) dropPartition(ctx context.Context, pool *pgxpool.Pool, name, table string, legacy bool) (rows int64, dropped bool, err error) {
	var heldIn bool
	if err := pool.QueryRow(ctx, fmt.Sprintf(heldInSQL, table, ib.tables.Table("inbox_holds"))).Scan(&heldIn); err != nil {
		return 0, false, fmt.Errorf("read the holds in partition %s: %w", name, err)
	}
	if heldIn {
		return 0, false, nil
	}
	sum, err := ib.summarise(ctx, pool, table)
	if err != nil {
		return 0, false, fmt.Errorf("read partition %s: %w", name, err)
	}
	held := func(q Querier) (bool, error) {
		var h bool
		err := q.QueryRow(ctx, ib.sql.heldAmong, sum.consumers).Scan(&h)
		return h, err
	}
	if h, err := held(pool); err != nil || h {
		return 0, false, err
	}
	for range partitionAttempts {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+partitionLockTimeout+"'"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "ALTER TABLE "+ib.table+" DETACH PARTITION "+table); err != nil {
				return err
			}
			if dropped, err = held(tx); err != nil || dropped {
				return errHeldMeanwhile // a hold taken since the read: keep the partition
			}
			if _, err := tx.Exec(ctx, ib.sql.forgetPartition, sum.consumers, sum.sources, sum.offsets, sum.seen); err != nil {
				return err
			}
			if legacy {
				if _, err := tx.Exec(ctx, "UPDATE "+ib.tables.Table("inbox_layout")+" SET legacy_until = NULL"); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+table)
			return err
		})
		switch {
		case err == nil:
			return sum.rows, true, nil
		case err == errHeldMeanwhile:
			return 0, false, nil
		case !isLockTimeout(err):
			return 0, false, fmt.Errorf("drop partition %s: %w", name, err)
		}
	}
	return 0, false, fmt.Errorf("drop partition %s: its locks were not granted in %d tries: %w", name, partitionAttempts, err)
}

// errHeldMeanwhile rolls back the drop of a partition whose rows a hold
// now covers.
var errHeldMeanwhile = fmt.Errorf("inbox: a scope in the partition was held meanwhile")

// summarise reads what the partition table holds per (consumer, source).
func (ib *Inbox) summarise(ctx context.Context, q Querier, table string) (partitionSummary, error) {
	var s partitionSummary
	rows, err := q.Query(ctx, fmt.Sprintf(partitionSummarySQL, table))
	if err != nil {
		return s, err
	}
	var c, src string
	var off *int64
	var seen time.Time
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&c, &src, &off, &seen, &n}, func() error {
		s.consumers, s.sources = append(s.consumers, c), append(s.sources, src)
		s.offsets, s.seen = append(s.offsets, off), append(s.seen, seen)
		s.rows += n
		return nil
	})
	return s, err
}
