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
// Then it deletes, the same way, the finished operations (succeeded or
// failed) past their expiry; unfinished ones stay. It returns how many
// records and operations it deleted. Run it periodically, e.g. every few
// minutes; an expired record that is still there behaves as absent anyway.
func (m *Middleware) Cleanup(ctx context.Context, chunk int) (int, error) {
	n, err := cleanupLoop(ctx, chunk, m.cleanupChunk)
	if err != nil {
		return n, err
	}
	ops, err := cleanupWith(ctx, m.pool, m.ops.sql.cleanup, chunk)
	return n + ops, err
}

// CleanupExpired deletes the expired records and finished operations in
// tables like Middleware.Cleanup, for a process that cleans without serving
// requests (the retention package, `idem cleanup`). It counts no metrics.
func CleanupExpired(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, chunk int) (int, error) {
	if err := tables.Validate(); err != nil {
		return 0, fmt.Errorf("httpinbox: %w", err)
	}
	n, err := cleanupWith(ctx, pool, newStatements(tables).cleanup, chunk)
	if err != nil {
		return n, err
	}
	ops, err := cleanupWith(ctx, pool, newOperationSQL(tables).cleanup, chunk)
	return n + ops, err
}

// cleanupWith runs the chunk statement sql (expired keys, or finished
// operations past their expiry) until a chunk comes back short.
func cleanupWith(ctx context.Context, pool *pgxpool.Pool, sql string, chunk int) (int, error) {
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

// deleteExpired runs the chunk statement sql (of keys or operations) once.
func deleteExpired(ctx context.Context, pool *pgxpool.Pool, sql string, chunk int) (int, error) {
	tag, err := pool.Exec(ctx, sql, chunk)
	if err != nil {
		return 0, fmt.Errorf("httpinbox: delete expired rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
