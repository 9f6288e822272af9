package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Partition widths LayOutPartitioned accepts.
const (
	// MinPartitionWidth is the narrowest partition: one minute (for tests).
	MinPartitionWidth = time.Minute
	// MaxPartitionWidth is the widest partition: 31 days.
	MaxPartitionWidth = 31 * 24 * time.Hour
	// DefaultPartitionsAhead is how many partitions after the one of now
	// EnsurePartitions (and so Cleanup) creates.
	DefaultPartitionsAhead = 4
)

// partitionLockTimeout bounds how long the DDL of a partition waits for
// its locks, and so how long a claim queued behind it waits; a partition
// not made in time is made by a later call (a claim never needs it: the
// default partition takes its row meanwhile).
const partitionLockTimeout = "1s"

// partitionAttempts is how many times a partition's DDL is tried when its
// lock is not granted in time.
const partitionAttempts = 3

// The partitioned layout. Rows are partitioned by range on their last
// sighting; the default partition takes a row no partition covers (one
// claimed before cleanup made the partition of its time), and
// EnsurePartitions moves such rows into the partition it makes for them.
// No index spans the partitions: each partition has its own unique index
// on (consumer, message_id), made with it. %[2]s names the check of the
// payload hash, as the plain table names it (an inbox converted online
// keeps its plain table as a partition, whose checks must match by name).
const (
	partitionedDDL = `CREATE TABLE %[1]s (
	consumer      text        COLLATE "C" NOT NULL,
	message_id    text        COLLATE "C" NOT NULL,
	payload_hash  bytea       NOT NULL CONSTRAINT %[2]s CHECK (octet_length(payload_hash) = 32),
	business_key  text,
	source        text        NOT NULL DEFAULT '',
	stream_offset bigint,
	received_at   timestamptz NOT NULL DEFAULT now(),
	seen_at       timestamptz,
	seen_offset   bigint
) PARTITION BY RANGE ((coalesce(seen_at, received_at)))`
	defaultPartitionDDL = `CREATE TABLE %[2]s PARTITION OF %[1]s DEFAULT;
CREATE UNIQUE INDEX ON %[2]s (consumer, message_id);
CREATE INDEX ON %[2]s ((coalesce(seen_at, received_at)))`
	layoutRowSQL = `INSERT INTO %s (partition_width, legacy_until) VALUES (make_interval(secs => $1), $2)`
)
const (
	widthSQL      = `SELECT extract(epoch FROM partition_width)::bigint FROM %s`
	partitionsSQL = `SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname LIKE $2 ORDER BY c.relname`
	// defaultBucketsSQL lists the partitions the rows in the default
	// partition belong to; it reads the default partition, which holds
	// rows only while cleanup has not made the partitions of their time.
	defaultBucketsSQL = `SELECT DISTINCT (floor(extract(epoch FROM coalesce(seen_at, received_at)) / $1) * $1)::bigint FROM %s`
)

// LayOutPartitioned lays the inbox out in time partitions of width, in tx:
// the table is made again, empty, partitioned on each row's last sighting.
// It is what `idem migrate --partition-width` and migrate.UpWith do after
// the migrations. An inbox partitioned already with the same width is left
// alone; one with another width is refused, and an unpartitioned inbox that
// holds rows is refused with ErrHoldsRows: convert it online with
// ConvertPartitioned. Call EnsurePartitions after tx commits.
func (ib *Inbox) LayOutPartitioned(ctx context.Context, tx pgx.Tx, width time.Duration) error {
	if width < MinPartitionWidth || width > MaxPartitionWidth || width%time.Second != 0 {
		return fmt.Errorf("inbox: partition width %v: want whole seconds from %v to %v", width, MinPartitionWidth, MaxPartitionWidth)
	}
	return ib.layOut(ctx, tx, width)
}

// layOut is LayOutPartitioned for a width already checked.
func (ib *Inbox) layOut(ctx context.Context, tx pgx.Tx, width time.Duration) error {
	ib.layout.Store(layoutUnknown)
	switch p, err := ib.isPartitioned(ctx, tx); {
	case err != nil:
		return err
	case p:
		w, err := ib.partitionWidth(ctx, tx)
		if err != nil || w == width {
			return err
		}
		return fmt.Errorf("inbox: %s is partitioned %v wide already, not %v", ib.table, w, width)
	}
	// Asked first without a lock, so that an inbox in use is not locked
	// only to be refused; then again under the lock.
	if rows, err := ib.holdsRows(ctx, tx); err != nil || rows {
		return cmpErr(err, fmt.Errorf("inbox: lay out %s in partitions: %w", ib.table, ErrHoldsRows))
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+ib.table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return fmt.Errorf("inbox: lay out %s: %w", ib.table, err)
	}
	var rows bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+ib.table+")").Scan(&rows); err != nil {
		return fmt.Errorf("inbox: lay out %s: %w", ib.table, err)
	}
	if rows {
		return fmt.Errorf("inbox: lay out %s in partitions: %w", ib.table, ErrHoldsRows)
	}
	steps := []string{
		"DROP TABLE " + ib.table,
		fmt.Sprintf(partitionedDDL, ib.table, pgx.Identifier{ib.tables.Prefix + "inbox_payload_hash_check"}.Sanitize()),
	}
	for _, s := range steps {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("inbox: lay out %s in partitions: %w", ib.table, err)
		}
	}
	if err := ib.finishLayout(ctx, tx, width, nil); err != nil {
		return err
	}
	ib.layout.Store(layoutPartitioned)
	return nil
}

// finishLayout makes the default partition of the partitioned inbox table
// and records the layout: its width, and where the partition of the old
// plain table ends when the inbox was converted (ConvertPartitioned).
func (ib *Inbox) finishLayout(ctx context.Context, tx pgx.Tx, width time.Duration, legacyUntil *time.Time) error {
	if _, err := tx.Exec(ctx, fmt.Sprintf(defaultPartitionDDL, ib.table, ib.tables.Table("inbox_default"))); err != nil {
		return fmt.Errorf("inbox: make the default partition of %s: %w", ib.table, err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(layoutRowSQL, ib.tables.Table("inbox_layout")), int64(width/time.Second), legacyUntil); err != nil {
		return fmt.Errorf("inbox: record the layout of %s: %w", ib.table, err)
	}
	return nil
}

// partitionWidth reads the width of the partitions.
func (ib *Inbox) partitionWidth(ctx context.Context, q Querier) (time.Duration, error) {
	var secs int64
	if err := q.QueryRow(ctx, fmt.Sprintf(widthSQL, ib.tables.Table("inbox_layout"))).Scan(&secs); err != nil {
		return 0, fmt.Errorf("inbox: read the partition width: %w", err)
	}
	return time.Duration(secs) * time.Second, nil
}

// partition names the partition of the bucket that starts at start (Unix
// seconds): prefix + "inbox_p" + start.
func (ib *Inbox) partition(start int64) (name, table string) {
	name = ib.tables.Prefix + "inbox_p" + strconv.FormatInt(start, 10)
	return name, pgx.Identifier{ib.tables.Schema, name}.Sanitize()
}

// partitions lists the starts of the partitions, oldest first.
func (ib *Inbox) partitions(ctx context.Context, q Querier) ([]int64, error) {
	prefix := ib.tables.Prefix + "inbox_p"
	like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
	rows, err := q.Query(ctx, partitionsSQL, ib.table, like)
	if err != nil {
		return nil, fmt.Errorf("inbox: list the partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: list the partitions: %w", err)
	}
	var starts []int64
	for _, n := range names {
		if s, err := strconv.ParseInt(strings.TrimPrefix(n, prefix), 10, 64); err == nil {
			starts = append(starts, s)
		}
	}
	slices.Sort(starts)
	return starts, nil
}

// EnsurePartitions makes the partition of now and the ahead partitions
// after it (DefaultPartitionsAhead when ahead is 0), and the partitions of
// any rows the default partition holds, moving those rows into them. It
// returns how many partitions it made. The retention package calls it on
// every round (through Cleanup), `idem migrate --partition-width` once:
// run retention more often than every ahead partitions, or claims fill the
// default partition meanwhile (they never fail for want of a partition)
// and the next round moves them. Each partition is made in a short
// transaction whose locks wait at most a second; one not made in time is
// tried again, then left to the next call. On an unpartitioned inbox it
// does nothing.
func (ib *Inbox) EnsurePartitions(ctx context.Context, pool *pgxpool.Pool, ahead int) (int, error) {
	if p, err := ib.readLayout(ctx, pool); err != nil || !p {
		return 0, err
	}
	if ahead <= 0 {
		ahead = DefaultPartitionsAhead
	}
	width, err := ib.partitionWidth(ctx, pool)
	if err != nil {
		return 0, err
	}
	w := int64(width / time.Second)
	var now int64
	if err := pool.QueryRow(ctx, "SELECT extract(epoch FROM now())::bigint").Scan(&now); err != nil {
		return 0, fmt.Errorf("inbox: ensure partitions: %w", err)
	}
	legacy, err := ib.legacyUntil(ctx, pool)
	if err != nil {
		return 0, err
	}
	want := make([]int64, 0, ahead+1)
	for i := range int64(ahead + 1) {
		// The partition of the old plain table covers every time before
		// legacy; the time partitions start there.
		if s := (now/w + i) * w; s >= legacy {
			want = append(want, s)
		}
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(defaultBucketsSQL, ib.tables.Table("inbox_default")), w)
	if err != nil {
		return 0, fmt.Errorf("inbox: ensure partitions: read the default partition: %w", err)
	}
	stray, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("inbox: ensure partitions: read the default partition: %w", err)
	}
	have, err := ib.partitions(ctx, pool)
	if err != nil {
		return 0, err
	}
	made := 0
	for _, s := range append(stray, want...) {
		if slices.Contains(have, s) {
			continue
		}
		if err := ib.makePartition(ctx, pool, s, w); err != nil {
			return made, err
		}
		have = append(have, s)
		made++
	}
	return made, nil
}

// makePartition makes the partition of the bucket [start, start+w) in its
// own transaction, moving into it the rows of the default partition it
// covers, and tries again when a lock is not granted in time.
func (ib *Inbox) makePartition(ctx context.Context, pool *pgxpool.Pool, start, w int64) error {
	name, table := ib.partition(start)
	from := time.Unix(start, 0).UTC().Format(time.RFC3339)
	to := time.Unix(start+w, 0).UTC().Format(time.RFC3339)
	def := ib.tables.Table("inbox_default")
	steps := []string{
		"SET LOCAL lock_timeout = '" + partitionLockTimeout + "'",
		// ACCESS EXCLUSIVE, not the SHARE UPDATE EXCLUSIVE that ATTACH
		// needs: a claim planned while the partition is attached could
		// miss it, and the rows moved into it with it.
		"LOCK TABLE " + ib.table + " IN ACCESS EXCLUSIVE MODE",
		"LOCK TABLE " + def + " IN ACCESS EXCLUSIVE MODE",
		"CREATE TABLE " + table + " (LIKE " + ib.table + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
		"CREATE UNIQUE INDEX ON " + table + " (consumer, message_id)",
		"WITH moved AS (DELETE FROM " + def + " WHERE coalesce(seen_at, received_at) >= '" + from +
			"' AND coalesce(seen_at, received_at) < '" + to + "' RETURNING *) INSERT INTO " + table + " SELECT * FROM moved",
		"ALTER TABLE " + ib.table + " ATTACH PARTITION " + table + " FOR VALUES FROM ('" + from + "') TO ('" + to + "')",
	}
	var err error
	for range partitionAttempts {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, s := range steps {
				if _, err := tx.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pgErr) && pgErr.Code == "42P07": // made meanwhile by another call
			return nil
		case !isLockTimeout(err):
			return fmt.Errorf("inbox: make partition %s: %w", name, err)
		}
	}
	return fmt.Errorf("inbox: make partition %s: its locks were not granted in %d tries: %w", name, partitionAttempts, err)
}

// isLockTimeout reports whether err is a lock not granted in time (or a
// deadlock, which PostgreSQL breaks by failing one of the waiters): the
// DDL of a partition is tried again.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}
