package deadletters

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/configerr"
	"github.com/idemkit/idem/internal/timeparts"
)

// table is the dead-letter table of tables, as its time partitions see it
// (laid out by migrate.UpWith's PartitionWidth).
func table(tables idem.Tables) timeparts.Table {
	return timeparts.New(tables, "dead_letters", "dead_lettered_at")
}

// DeleteBefore deletes the dead-letter rows of tables written before
// cutoff and returns how many it deleted (so far, when it fails). The
// retention package (`idem cleanup`) calls it with its cutoff.
//
// A table in time partitions (`idem migrate --partition-width`) loses every
// partition that lies wholly before the cutoff, dropped whole, after the
// partition of now and those ahead of it are made; the rows before the cutoff in the
// partition it falls in, and in the default partition, are then deleted
// as in the plain layout: chunk rows per statement, each its own
// transaction, skipping rows a transaction holds locked.
func DeleteBefore(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (int64, error) {
	if err := tables.Validate(); err != nil {
		return 0, fmt.Errorf("deadletters: %w", err)
	}
	if chunk <= 0 {
		return 0, fmt.Errorf("deadletters: %w: the chunk size must be positive, not %d", configerr.ErrConfig, chunk)
	}
	t := table(tables)
	if _, err := t.Ensure(ctx, pool, 0); err != nil {
		return 0, fmt.Errorf("deadletters: %w", err)
	}
	deleted, _, err := t.DropBefore(ctx, pool, cutoff)
	if err != nil {
		return deleted, fmt.Errorf("deadletters: %w", err)
	}
	leaves, err := t.Leaves(ctx, pool, cutoff)
	if err != nil {
		return deleted, fmt.Errorf("deadletters: %w", err)
	}
	for _, leaf := range leaves {
		n, err := chunked.Delete(ctx, pool, chunked.OlderThan(leaf, "dead_lettered_at"), cutoff, chunk, 1)
		deleted += n[0]
		if err != nil {
			return deleted, fmt.Errorf("deadletters: delete rows before %s: %w", cutoff.Format(time.RFC3339), err)
		}
	}
	return deleted, nil
}
