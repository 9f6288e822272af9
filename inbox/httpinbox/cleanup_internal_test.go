package httpinbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testdb"
)

func TestCleanupChunkDeletesAtMostChunkRows(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	m, err := New(pool, Config{Tables: tables, SharedScope: true})
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO `+tables.Table("http_keys")+`
		(key_id, tenant, caller, operation, idempotency_key, fingerprint, expires_at)
		SELECT sha256(i::text::bytea), '', '', 'op', i::text, sha256(''::bytea), now() - interval '1 second'
		FROM generate_series(1, 5) AS i`)
	require.NoError(t, err)

	for _, want := range []int{2, 2, 1, 0} {
		n, err := m.cleanupChunk(context.Background(), 2)
		require.NoError(t, err)
		require.Equal(t, want, n)
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
