package httpinbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// DefaultCleanupChunk is the chunk size Cleanup uses when given 0.
const DefaultCleanupChunk = 1000

// Cleanup deletes expired records, chunk rows per statement (each its own
// short transaction, so it never holds many locks or a long snapshot), until
// a chunk comes back short. It skips records whose handler is still running.
// It returns how many records it deleted. Run it periodically, e.g. every few
// minutes; an expired record that is still there behaves as absent anyway.
func (m *Middleware) Cleanup(ctx context.Context, chunk int) (int, error) {
	return cleanupLoop(ctx, chunk, m.cleanupChunk)
}

// CleanupExpired deletes the expired records in tables like
// Middleware.Cleanup, for a process that cleans without serving requests
// (the retention package, `idem cleanup`). It counts no metrics.
func CleanupExpired(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, chunk int) (int, error) {
	if err := tables.Validate(); err != nil {
		return 0, fmt.Errorf("httpinbox: %w", err)
	}
	sql := newStatements(tables).cleanup
	return cleanupLoop(ctx, chunk, func(ctx context.Context, chunk int) (int, error) {
		return deleteExpired(ctx, pool, sql, chunk)
	})
}

// cleanupLoop runs one chunk after another until a chunk comes back short.
func cleanupLoop(ctx context.Context, chunk int, one func(ctx context.Context, chunk int) (int, error)) (int, error) {
	if chunk <= 0 {
		chunk = DefaultCleanupChunk
	}
	total := 0
	for {
		n, err := one(ctx, chunk)
		total += n
		if err != nil {
			return total, err
		}
		if n < chunk {
			return total, nil
		}
	}
}

// cleanupChunk deletes at most chunk expired records.
func (m *Middleware) cleanupChunk(ctx context.Context, chunk int) (int, error) {
	n, err := deleteExpired(ctx, m.pool, m.sql.cleanup, chunk)
	if n > 0 {
		m.metrics.expired.Add(ctx, int64(n))
	}
	return n, err
}

// deleteExpired runs the chunk statement sql once.
func deleteExpired(ctx context.Context, pool *pgxpool.Pool, sql string, chunk int) (int, error) {
	tag, err := pool.Exec(ctx, sql, chunk)
	if err != nil {
		return 0, fmt.Errorf("httpinbox: delete expired keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
