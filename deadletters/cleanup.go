package deadletters

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chunked"
)

// DeleteBefore deletes the dead-letter rows of tables written before
// cutoff, chunk rows per statement, each its own transaction, skipping rows
// a transaction holds locked; it returns how many it deleted (so far, when
// it fails). The retention package (`idem cleanup`) calls it with its
// cutoff.
func DeleteBefore(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (int64, error) {
	if err := tables.Validate(); err != nil {
		return 0, fmt.Errorf("deadletters: %w", err)
	}
	n, err := chunked.Delete(ctx, pool, chunked.OlderThan(tables.Table("dead_letters"), "dead_lettered_at"), cutoff, chunk, 1)
	if err != nil {
		return n[0], fmt.Errorf("deadletters: delete rows before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], nil
}
