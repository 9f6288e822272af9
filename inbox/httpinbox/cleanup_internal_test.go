package httpinbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestCleanupChunkDeletesAtMostChunkRowsAndStartsWhereTheLastStopped(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	m, err := New(pool, Config{Tables: tables, SharedScope: true})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = pool.Exec(ctx, `INSERT INTO `+tables.Table("http_keys")+`
		(key_id, tenant, caller, operation, idempotency_key, fingerprint, expires_at, forget_at)
		SELECT sha256(i::text::bytea), '', '', 'op', i::text, sha256(''::bytea), now() - interval '1 day',
			now() - (10 - i) * interval '1 minute'
		FROM generate_series(1, 5) AS i`)
	require.NoError(t, err)
	var cutoff time.Time
	require.NoError(t, pool.QueryRow(ctx, cleanupCutoffSQL).Scan(&cutoff))

	from := time.Time{}
	for _, want := range []int{2, 2, 1, 0} {
		var n int
		prev := from
		require.NoError(t, pool.QueryRow(ctx, m.sql.cleanup, cutoff, from, 2).Scan(&n, &from))
		require.Equal(t, want, n)
		if n == 0 {
			require.Equal(t, prev, from, "an empty chunk leaves the start where it was")
		} else {
			require.True(t, from.After(prev), "each chunk starts after the one before")
		}
	}
}

func TestCleanupExpiredNeedsNoMiddleware(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+tables.Table("http_keys")+`
		(key_id, tenant, caller, operation, idempotency_key, fingerprint, expires_at)
		SELECT sha256(i::text::bytea), '', '', 'op', i::text, sha256(''::bytea), now() + (i - 4) * interval '1 minute'
		FROM generate_series(1, 5) AS i`)
	require.NoError(t, err)
	n, err := CleanupExpired(context.Background(), pool, tables, 2)
	require.NoError(t, err)
	require.Equal(t, 4, n, "the four keys that expired by now, in chunks of 2; the fifth has a minute left")
}
