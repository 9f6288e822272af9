// Package timeparts keeps one of idem's history tables (other than the
// inbox, whose claim needs a layout of its own) partitioned by range on a
// timestamptz column, in partitions of one width, so that retention drops
// whole partitions instead of deleting rows one by one.
//
// A table is laid out once, while it is empty (LayOut, from `idem migrate
// --partition-width`); the width is recorded in the time_partitions table,
// which this package alone writes. A default partition takes a row no
// partition covers, so that a write never fails for want of a partition;
// Ensure, which retention runs on every round, makes the partition of now
// and those ahead of it, and the partitions of the rows the default
// partition holds, moving those rows into them. DropBefore drops the
// partitions that lie wholly before a cutoff; Leaves names the tables that
// may still hold older rows (the partition the cutoff falls in, the
// default partition), which the table's owner deletes from row by row.
//
// The partitions are named after the table and the Unix second their
// range starts at: prefix + "dead_letters_p1767225600". Each DDL step runs
// in a short transaction whose lock waits end after a second; a step not
// granted its lock is tried again, then left to the next call.
package timeparts

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

	"github.com/idemkit/idem"
)

// Partition widths LayOut accepts.
const (
	// MinWidth is the narrowest partition: one minute (for tests).
	MinWidth = time.Minute
	// MaxWidth is the widest partition: 31 days.
	MaxWidth = 31 * 24 * time.Hour
	// DefaultAhead is how many partitions after the one of now Ensure
	// makes.
	DefaultAhead = 4
)

// ErrHoldsRows is returned (wrapped) by LayOut for a table that holds
// rows: it keeps the plain layout.
var ErrHoldsRows = errors.New("timeparts: the table holds rows")

const (
	// lockTimeout bounds how long a step's DDL waits for its locks, and so
	// how long a write queued behind it waits.
	lockTimeout = "1s"
	// attempts is how many times a step whose lock was not granted in
	// time is tried.
	attempts = 3
)

// Table is a table of idem's kept in time partitions.
type Table struct {
	tables idem.Tables
	name   string // unqualified, without the prefix: "dead_letters"
	column string // the timestamptz column the partitions range over
}

// New returns the table name of tables, partitioned on column.
func New(tables idem.Tables, name, column string) Table {
	return Table{tables: tables.WithDefaults(), name: name, column: column}
}

// quoted is the table's qualified, quoted name.
func (t Table) quoted() string { return t.tables.Table(t.name) }

// relation is the table's name as time_partitions records it.
func (t Table) relation() string { return t.tables.Prefix + t.name }

// defaultPartition is the quoted name of the default partition.
func (t Table) defaultPartition() string { return t.tables.Table(t.name + "_default") }

// partition names the partition whose range starts at start (Unix
// seconds).
func (t Table) partition(start int64) (name, quoted string) {
	name = t.relation() + "_p" + strconv.FormatInt(start, 10)
	return name, pgx.Identifier{t.tables.Schema, name}.Sanitize()
}

// Querier is what the read-only functions run their statements on: a
// pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Width returns the width of the table's partitions, or 0 when the table
// keeps the plain layout.
func (t Table) Width(ctx context.Context, q Querier) (time.Duration, error) {
	var secs int64
	err := q.QueryRow(ctx, `SELECT extract(epoch FROM width)::bigint FROM `+t.tables.Table("time_partitions")+
		` WHERE relation = $1`, t.relation()).Scan(&secs)
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return 0, nil // not laid out, or a schema migrated before time_partitions was
	}
	if err != nil {
		return 0, fmt.Errorf("timeparts: read the partition width of %s: %w", t.relation(), err)
	}
	return time.Duration(secs) * time.Second, nil
}

// LayOut makes the table again, in tx, partitioned by range on its column
// in partitions of width, with the same columns, defaults, checks and
// indexes, its primary key extended by the column, and a default
// partition; it records the width. A table partitioned already with the
// same width is left alone, one with another width is refused, and one
// that holds rows is refused with ErrHoldsRows. Call Ensure after tx
// commits.
func (t Table) LayOut(ctx context.Context, tx pgx.Tx, width time.Duration) error {
	if width < MinWidth || width > MaxWidth || width%time.Second != 0 {
		return fmt.Errorf("timeparts: partition width %v: want whole seconds from %v to %v", width, MinWidth, MaxWidth)
	}
	switch w, err := t.Width(ctx, tx); {
	case err != nil:
		return err
	case w == width:
		return nil
	case w != 0:
		return fmt.Errorf("timeparts: %s is partitioned %v wide already, not %v", t.relation(), w, width)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+t.quoted()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return fmt.Errorf("timeparts: lay out %s: %w", t.relation(), err)
	}
	var rows bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+t.quoted()+")").Scan(&rows); err != nil {
		return fmt.Errorf("timeparts: lay out %s: %w", t.relation(), err)
	}
	if rows {
		return fmt.Errorf("timeparts: lay out %s in partitions: %w", t.relation(), ErrHoldsRows)
	}
	if err := t.remake(ctx, tx); err != nil {
		return fmt.Errorf("timeparts: lay out %s: %w", t.relation(), err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+t.tables.Table("time_partitions")+" (relation, width) VALUES ($1, make_interval(secs => $2))",
		t.relation(), int64(width/time.Second)); err != nil {
		return fmt.Errorf("timeparts: record the layout of %s: %w", t.relation(), err)
	}
	return nil
}

// remake replaces the empty plain table by a partitioned one.
func (t Table) remake(ctx context.Context, tx pgx.Tx) error {
	// The indexes other than the primary key, as the plain table has them
	// (CREATE INDEX statements).
	rows, err := tx.Query(ctx, `SELECT pg_get_indexdef(i.indexrelid) FROM pg_index AS i
WHERE i.indrelid = to_regclass($1) AND NOT i.indisprimary ORDER BY i.indexrelid`, t.quoted())
	if err != nil {
		return err
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var pkName string
	if err := tx.QueryRow(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'`,
		t.quoted()).Scan(&pkName); err != nil {
		return fmt.Errorf("read the primary key: %w", err)
	}
	var pk []string
	rows, err = tx.Query(ctx, `SELECT a.attname FROM pg_index AS i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = to_regclass($1) AND i.indisprimary ORDER BY k.n`, t.quoted())
	if err != nil {
		return err
	}
	if pk, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return err
	}
	if !slices.Contains(pk, t.column) {
		pk = append(pk, t.column)
	}
	plain := t.tables.Table(t.name + "_plain")
	keys := make([]string, len(pk))
	for i, c := range pk {
		keys[i] = pgx.Identifier{c}.Sanitize()
	}
	steps := []string{
		"ALTER TABLE " + t.quoted() + " RENAME TO " + pgx.Identifier{t.relation() + "_plain"}.Sanitize(),
		"CREATE TABLE " + t.quoted() + " (LIKE " + plain + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY" +
			" INCLUDING GENERATED INCLUDING COMMENTS) PARTITION BY RANGE (" + pgx.Identifier{t.column}.Sanitize() + ")",
		"DROP TABLE " + plain,
		"ALTER TABLE " + t.quoted() + " ADD CONSTRAINT " + pgx.Identifier{pkName}.Sanitize() +
			" PRIMARY KEY (" + strings.Join(keys, ", ") + ")",
	}
	// Each definition names the table by the name the partitioned table
	// takes, and the index by the name the dropped one frees.
	steps = append(steps, indexes...)
	steps = append(steps, "CREATE TABLE "+t.defaultPartition()+" PARTITION OF "+t.quoted()+" DEFAULT")
	for _, s := range steps {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(s, " (", 2)[0], err)
		}
	}
	return nil
}

// partitions lists the starts of the table's partitions, oldest first.
func (t Table) partitions(ctx context.Context, q Querier) ([]int64, error) {
	prefix := t.relation() + "_p"
	like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname LIKE $2`, t.quoted(), like)
	if err != nil {
		return nil, fmt.Errorf("timeparts: list the partitions of %s: %w", t.relation(), err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("timeparts: list the partitions of %s: %w", t.relation(), err)
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

// Ensure makes the partition of now and the ahead partitions after it
// (DefaultAhead when ahead is 0), and the partitions of the rows the
// default partition holds, moving those rows into them; it returns how
// many partitions it made. On a table in the plain layout it does nothing.
// The retention package runs it on every round: run retention more often
// than every ahead partitions, or writes fill the default partition
// meanwhile (they never fail) and the next round moves them.
func (t Table) Ensure(ctx context.Context, pool *pgxpool.Pool, ahead int) (int, error) {
	width, err := t.Width(ctx, pool)
	if err != nil || width == 0 {
		return 0, err
	}
	if ahead <= 0 {
		ahead = DefaultAhead
	}
	w := int64(width / time.Second)
	var now int64
	if err := pool.QueryRow(ctx, "SELECT extract(epoch FROM now())::bigint").Scan(&now); err != nil {
		return 0, fmt.Errorf("timeparts: ensure the partitions of %s: %w", t.relation(), err)
	}
	want := make([]int64, 0, ahead+1)
	for i := range int64(ahead + 1) {
		want = append(want, (now/w+i)*w)
	}
	col := pgx.Identifier{t.column}.Sanitize()
	rows, err := pool.Query(ctx, "SELECT DISTINCT (floor(extract(epoch FROM "+col+") / $1) * $1)::bigint FROM "+t.defaultPartition(), w)
	if err != nil {
		return 0, fmt.Errorf("timeparts: ensure the partitions of %s: read the default partition: %w", t.relation(), err)
	}
	stray, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("timeparts: ensure the partitions of %s: read the default partition: %w", t.relation(), err)
	}
	have, err := t.partitions(ctx, pool)
	if err != nil {
		return 0, err
	}
	made := 0
	for _, s := range append(stray, want...) {
		if slices.Contains(have, s) {
			continue
		}
		if err := t.makePartition(ctx, pool, s, w); err != nil {
			return made, err
		}
		have = append(have, s)
		made++
	}
	return made, nil
}

// makePartition makes the partition [start, start+w), moving into it the
// rows of the default partition it covers.
func (t Table) makePartition(ctx context.Context, pool *pgxpool.Pool, start, w int64) error {
	name, table := t.partition(start)
	from := time.Unix(start, 0).UTC().Format(time.RFC3339)
	to := time.Unix(start+w, 0).UTC().Format(time.RFC3339)
	col, def := pgx.Identifier{t.column}.Sanitize(), t.defaultPartition()
	steps := []string{
		"LOCK TABLE " + t.quoted() + " IN SHARE UPDATE EXCLUSIVE MODE",
		"LOCK TABLE " + def + " IN ACCESS EXCLUSIVE MODE",
		"CREATE TABLE " + table + " (LIKE " + t.quoted() + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
		"WITH moved AS (DELETE FROM " + def + " WHERE " + col + " >= '" + from + "' AND " + col + " < '" + to +
			"' RETURNING *) INSERT INTO " + table + " SELECT * FROM moved",
		// ATTACH makes the partition's indexes from the table's, and
		// reads the new partition (small: the moved rows) to check them.
		"ALTER TABLE " + t.quoted() + " ATTACH PARTITION " + table + " FOR VALUES FROM ('" + from + "') TO ('" + to + "')",
	}
	err := short(ctx, pool, func(tx pgx.Tx) error {
		for _, s := range steps {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // made meanwhile by another call
		return nil
	}
	if err != nil {
		return fmt.Errorf("timeparts: make partition %s: %w", name, err)
	}
	return nil
}

// DropBefore drops, oldest first, every partition of the table whose range
// ends at or before cutoff, each in a short transaction of its own, and
// returns how many rows and partitions it dropped. It reads each partition
// once, to count its rows, before the transaction that drops it. On a table
// in the plain layout it does nothing.
func (t Table) DropBefore(ctx context.Context, pool *pgxpool.Pool, cutoff time.Time) (rows int64, partitions int, err error) {
	width, err := t.Width(ctx, pool)
	if err != nil || width == 0 {
		return 0, 0, err
	}
	starts, err := t.partitions(ctx, pool)
	if err != nil {
		return 0, 0, err
	}
	w := int64(width / time.Second)
	for _, s := range starts {
		if s+w > cutoff.Unix() {
			break
		}
		name, table := t.partition(s)
		var n int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			return rows, partitions, fmt.Errorf("timeparts: count the rows of partition %s: %w", name, err)
		}
		err := short(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+t.quoted()+" DETACH PARTITION "+table); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+table)
			return err
		})
		if err != nil {
			return rows, partitions, fmt.Errorf("timeparts: drop partition %s: %w", name, err)
		}
		rows += n
		partitions++
	}
	return rows, partitions, nil
}

// Leaves returns the quoted names of the tables that may hold rows older
// than cutoff: the partitions that start before it (once DropBefore has
// run, the one the cutoff falls in) and the default partition; for a table
// in the plain
// layout, the table itself. Their owner deletes those rows one by one (a
// row address names a row only within its partition).
func (t Table) Leaves(ctx context.Context, q Querier, cutoff time.Time) ([]string, error) {
	width, err := t.Width(ctx, q)
	if err != nil {
		return nil, err
	}
	if width == 0 {
		return []string{t.quoted()}, nil
	}
	starts, err := t.partitions(ctx, q)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range starts {
		if s < cutoff.Unix() {
			_, table := t.partition(s)
			out = append(out, table)
		}
	}
	return append(out, t.defaultPartition()), nil
}

// short runs do in a transaction whose lock waits end after lockTimeout,
// and tries again while a lock is not granted in time (or a deadlock
// breaks the wait).
func short(ctx context.Context, pool *pgxpool.Pool, do func(tx pgx.Tx) error) error {
	var err error
	for range attempts {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			return do(tx)
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" && pgErr.Code != "40P01" {
			return err
		}
	}
	return fmt.Errorf("its locks were not granted in %d tries: %w", attempts, err)
}
