// Package chunked runs a retention delete chunk after chunk: one statement
// per chunk, each in its own short transaction, so that a clean-up never
// holds many locks or a long snapshot. The packages that own idem's tables
// write their own statements; retention calls them.
//
// A clean-up's work must follow the rows it deletes, not their square. The
// rows a chunk deletes stay in the table and its indexes, dead, until
// VACUUM, and VACUUM cannot remove them while any snapshot older than the
// deletion is open (a long report, a replica's feedback, a REPEATABLE READ
// transaction). A chunk that starts its scan from the beginning again reads
// every row the chunks before it deleted: N²/2 per N rows. A Keyset
// statement starts each chunk after the key where the one before stopped.
package chunked

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/configerr"
)

// Keyset is a chunk statement that walks its table forward by a
// timestamptz key, for Delete. It takes $1 the cutoff, $2 the chunk size
// and $3 the key the walk has passed (-infinity for the first chunk), and
// returns one count per table it deletes from, then how many rows the walk
// found after $3 (fewer than $2: the walk is over), then the key the next
// chunk starts after.
type Keyset string

// OlderThan returns the chunk statement that deletes the rows of table
// (quoted and qualified) whose timestamptz column is before the cutoff,
// skipping rows a transaction holds locked. It walks an index on column
// forward (next), $2 rows at a time, with the other rows that share the
// key of the last of them (ties), so that the next chunk starts strictly
// after that key: rows written in one transaction share one now(). A row
// updated since next read it has a new address and is left for the next
// run. The range and limit are all the planner has to estimate in the
// walk: an index scan whatever the statistics say.
func OlderThan(table, column string) Keyset {
	return Keyset(fmt.Sprintf(`WITH next AS (
	SELECT ctid, %[2]s AS key FROM %[1]s WHERE %[2]s > $3 AND %[2]s < $1 ORDER BY %[2]s LIMIT $2
), ties AS (
	SELECT ctid FROM %[1]s WHERE %[2]s = (SELECT max(key) FROM next)
), doomed AS (
	SELECT ctid FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM next UNION ALL SELECT ctid FROM ties))
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
	RETURNING 1
)
SELECT count(*), (SELECT count(*) FROM next), (SELECT max(key) FROM next) FROM gone`, table, pgx.Identifier{column}.Sanitize()))
}

// Delete runs sql, with $1 the cutoff and $2 the chunk size, until a chunk
// deletes fewer than chunk rows from its first table. sql returns one
// count per table it deletes from, n in all, the first table's first; Delete
// returns their totals, what it deleted so far when it fails.
//
// A Keyset statement (OlderThan's) is walked instead: each chunk starts
// after the key the one before returned, until one finds fewer than chunk
// rows. A plain string statement starts every chunk from the beginning of
// its scan, and reads again what the chunks before it deleted.
func Delete[S ~string](ctx context.Context, pool *pgxpool.Pool, sql S, cutoff time.Time, chunk, n int) ([]int64, error) {
	totals := make([]int64, n)
	if chunk <= 0 {
		return totals, fmt.Errorf("chunked: %w: the chunk size must be positive, not %d", configerr.ErrConfig, chunk)
	}
	if k, ok := any(sql).(Keyset); ok {
		return totals, walk(ctx, pool, k, cutoff, chunk, totals)
	}
	counts := make([]int64, n)
	dest := make([]any, n)
	for i := range counts {
		dest[i] = &counts[i]
	}
	for {
		if err := pool.QueryRow(ctx, string(sql), cutoff, chunk).Scan(dest...); err != nil {
			return totals, err
		}
		for i, c := range counts {
			totals[i] += c
		}
		if counts[0] < int64(chunk) {
			return totals, nil
		}
	}
}

// walk runs the Keyset statement sql from the first key on, each chunk
// after the key the one before returned, adding its counts to totals,
// until a chunk finds fewer than chunk rows.
func walk(ctx context.Context, pool *pgxpool.Pool, sql Keyset, cutoff time.Time, chunk int, totals []int64) error {
	counts := make([]int64, len(totals))
	var found int64
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	dest := make([]any, 0, len(totals)+2)
	for i := range counts {
		dest = append(dest, &counts[i])
	}
	dest = append(dest, &found, &after)
	for {
		if err := pool.QueryRow(ctx, string(sql), cutoff, chunk, after).Scan(dest...); err != nil {
			return err
		}
		for i, c := range counts {
			totals[i] += c
		}
		if found < int64(chunk) {
			return nil
		}
	}
}
