// Package chunked runs a retention delete chunk after chunk: one statement
// per chunk, each in its own short transaction, so that a clean-up never
// holds many locks or a long snapshot. The packages that own idem's tables
// write their own statements; retention calls them.
package chunked

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OlderThan returns the chunk statement for Delete that deletes the rows of
// table (quoted and qualified) whose timestamptz column is before the
// cutoff, skipping rows a transaction holds locked.
func OlderThan(table, column string) string {
	return fmt.Sprintf(`WITH gone AS (
	DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE %[2]s < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))
	RETURNING 1
)
SELECT count(*) FROM gone`, table, pgx.Identifier{column}.Sanitize())
}

// Delete runs sql, with $1 the cutoff and $2 the chunk size, until a chunk
// deletes fewer than chunk rows from its first table. sql returns one
// count per table it deletes from, n in all, the first table's first; Delete
// returns their totals, what it deleted so far when it fails.
func Delete(ctx context.Context, pool *pgxpool.Pool, sql string, cutoff time.Time, chunk, n int) ([]int64, error) {
	totals := make([]int64, n)
	if chunk <= 0 {
		return totals, fmt.Errorf("chunked: the chunk size must be positive, not %d", chunk)
	}
	counts := make([]int64, n)
	dest := make([]any, n)
	for i := range counts {
		dest[i] = &counts[i]
	}
	for {
		if err := pool.QueryRow(ctx, sql, cutoff, chunk).Scan(dest...); err != nil {
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
