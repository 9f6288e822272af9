package httpinbox

import (
	"context"
	"fmt"
)

// DefaultCleanupChunk is the chunk size Cleanup uses when given 0.
const DefaultCleanupChunk = 1000

// Cleanup deletes expired records, chunk rows per statement (each its own
// short transaction, so it never holds many locks or a long snapshot), until
// a chunk comes back short. It skips records whose handler is still running.
// It returns how many records it deleted. Run it periodically, e.g. every few
// minutes; an expired record that is still there behaves as absent anyway.
func (m *Middleware) Cleanup(ctx context.Context, chunk int) (int, error) {
	if chunk <= 0 {
		chunk = DefaultCleanupChunk
	}
	total := 0
	for {
		n, err := m.cleanupChunk(ctx, chunk)
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
	tag, err := m.pool.Exec(ctx, m.sql.cleanup, chunk)
	if err != nil {
		return 0, fmt.Errorf("httpinbox: delete expired keys: %w", err)
	}
	n := int(tag.RowsAffected())
	if n > 0 {
		m.metrics.expired.Add(ctx, int64(n))
	}
	return n, nil
}
