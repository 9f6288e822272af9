package chunked

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/configerr"
)

// DeleteFrom runs sql as Delete does, with $3 the key the chunk starts
// from: sql walks an index in key order from $3, deletes up to $2 rows
// older than $1, and returns its n counts followed by the key the next chunk
// starts from (the newest key it deleted, or $3 when it deleted nothing).
// No chunk then reads again the index entries of the rows the chunks before
// it deleted (they stay in the index until VACUUM, and a snapshot held open
// elsewhere keeps them from being marked dead), so the work grows with the
// rows deleted, not with their square. from is the first chunk's key (the
// zero time: from the oldest row). Rows a chunk skipped (locked, or kept by
// its statement) below the key are left to the next call.
func DeleteFrom(ctx context.Context, pool *pgxpool.Pool, sql string, cutoff time.Time, chunk, n int, from time.Time) ([]int64, error) {
	totals := make([]int64, n)
	if chunk <= 0 {
		return totals, fmt.Errorf("chunked: %w: the chunk size must be positive, not %d", configerr.ErrConfig, chunk)
	}
	counts := make([]int64, n)
	dest := make([]any, n+1)
	for i := range counts {
		dest[i] = &counts[i]
	}
	dest[n] = &from
	for {
		if err := pool.QueryRow(ctx, sql, cutoff, chunk, from).Scan(dest...); err != nil {
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
