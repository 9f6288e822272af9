package httpinbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// Cleanup deletes forgotten keys in chunks, and each chunk starts where the
// one before it stopped: with a snapshot held open (a long report, a
// replica's feedback), the index entries of the rows deleted so far stay
// until VACUUM, and a chunk that walked the index from its start would read
// them all again, making a cleanup's work grow with the square of the rows
// it deletes. Counted with the server's own counters, over custom plans
// (the first five chunks) and the generic plan (the others).
func TestCleanupReadsEachIndexEntryOnceWhileASnapshotIsHeld(t *testing.T) {
	t.Parallel()
	shared, tables := testdb.Schema(t)
	ctx := context.Background()
	const rows, chunk = 3000, 100
	_, err := shared.Exec(ctx, `INSERT INTO `+tables.Table("http_keys")+`
		(key_id, tenant, caller, operation, idempotency_key, fingerprint, state, expires_at, forget_at)
		SELECT sha256(i::text::bytea), '', 'c', 'op', i::text, sha256(''::bytea), 'completed',
			now() - interval '30 days', now() - interval '1 day' + i * interval '1 second'
		FROM generate_series(1, $1::int) AS i`, rows)
	require.NoError(t, err)
	// As autovacuum would have by now: without statistics the planner
	// takes the range for a few rows, and reads and sorts it all.
	_, err = shared.Exec(ctx, `ANALYZE `+tables.Table("http_keys"))
	require.NoError(t, err)

	snapshot, err := shared.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = snapshot.Rollback(ctx) }()
	_, err = snapshot.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	var n int
	require.NoError(t, snapshot.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("http_keys")).Scan(&n))
	require.Equal(t, rows, n)

	// One connection, so that its statistics can be flushed on demand.
	cfg := shared.Config()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	t2 := tables.WithDefaults()
	index := pgx.Identifier{t2.Schema, t2.Prefix + "http_keys_forget_idx"}.Sanitize()
	entriesRead := func() (read int64) {
		_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT idx_tup_read FROM pg_stat_user_indexes
			WHERE indexrelid = to_regclass($1)`, index).Scan(&read))
		return read
	}
	before := entriesRead()
	deleted, err := httpinbox.CleanupExpired(ctx, pool, tables, chunk)
	require.NoError(t, err)
	require.Equal(t, rows, deleted)
	read := entriesRead() - before
	// Each row's entry once, and the few a chunk reads past its last row.
	require.LessOrEqual(t, read, int64(rows+2*rows/chunk), "%d index entries read to delete %d rows", read, rows)
}
