package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DeleteScopeStatement is the statement of one DeleteScope chunk, for the
// tests of package inbox_test to look at its plan.
func DeleteScopeStatement(ib *Inbox) string { return ib.sql.deleteScope }

// ScopeChunk is how many rows one DeleteScope chunk deletes.
const ScopeChunk = scopeChunk

// LayOutNarrow lays the inbox out in partitions narrower than
// MinPartitionWidth, so that tests see partitions start within seconds.
func LayOutNarrow(ctx context.Context, ib *Inbox, tx pgx.Tx, width time.Duration) error {
	return ib.layOut(ctx, tx, width)
}

// ConvertNarrow converts the inbox online (ConvertPartitioned) to
// partitions of any width, with the legacy partition ending at least lead
// ahead, so that tests see claims move past it within seconds.
func ConvertNarrow(ctx context.Context, ib *Inbox, pool *pgxpool.Pool, width, lead time.Duration) error {
	return ib.convert(ctx, pool, width, lead)
}
