package httpinbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// DefaultCleanupChunk is the chunk size Cleanup uses when given 0.
const DefaultCleanupChunk = 1000

// cleanupCutoffSQL is the database's clock when a cleanup starts: what
// expires later waits for the next cleanup.
const cleanupCutoffSQL = `SELECT now()`

// Cleanup deletes the records whose tombstone has passed (Config.Tombstone
// after their expiry, or the expiry itself with NoTombstone), chunk rows per
// statement (each its own short transaction, so it never holds many locks
// or a long snapshot), until a chunk comes back short. Each chunk starts
// where the one before it stopped, so the work grows with the rows deleted,
// not with their square. It skips records whose handler is still running,
// and unknown ones. Then it deletes, the same way, the finished operations
// (succeeded or failed) past their expiry; unfinished ones stay. It returns
// how many records and operations it deleted. Run it periodically, e.g.
// every few minutes; a forgotten record that is still there behaves as
// absent anyway.
func (m *Middleware) Cleanup(ctx context.Context, chunk int) (int, error) {
	n, err := cleanupWith(ctx, m.pool, m.sql.cleanup, chunk)
	if n > 0 {
		m.metrics.expired.Add(ctx, int64(n))
	}
	if err != nil {
		return n, err
	}
	ops, err := cleanupWith(ctx, m.pool, m.ops.sql.cleanup, chunk)
	return n + ops, err
}

// CleanupExpired deletes the forgotten records and finished operations in
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

// cleanupWith runs the chunk statement sql (forgotten keys, or finished
// operations past their expiry) until a chunk comes back short. sql takes
// the cutoff ($1), the time the chunk starts from ($2) and the chunk size
// ($3), and returns how many rows it deleted and the newest time among
// them, where the next chunk starts.
func cleanupWith(ctx context.Context, pool *pgxpool.Pool, sql string, chunk int) (int, error) {
	if chunk <= 0 {
		chunk = DefaultCleanupChunk
	}
	var cutoff time.Time
	if err := pool.QueryRow(ctx, cleanupCutoffSQL).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("httpinbox: delete expired rows: cutoff: %w", err)
	}
	total := 0
	from := time.Time{}
	for {
		var n int
		if err := pool.QueryRow(ctx, sql, cutoff, from, chunk).Scan(&n, &from); err != nil {
			return total, fmt.Errorf("httpinbox: delete expired rows after %d: %w", total, err)
		}
		total += n
		if n < chunk {
			return total, nil
		}
	}
}
