package inbox_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
)

// A batch's lookups by key (the stored hashes of its repeats, the unclaim of
// its postponed messages) read their keys' rows only, even on a connection
// that ran them often while the table was small and the table has grown
// since, without fresh statistics. A cached generic plan chosen on the
// small table would read the consumer's whole range on every batch.
func TestBatchLookupsReadOnlyTheirKeysAfterTheTableGrew(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	table := tables.Table("inbox")
	_, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	// A young table: a few rows for each of many consumers, analyzed.
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash)
SELECT 'other-' || (i % 40), 'seed-' || i, sha256(i::text::bytea) FROM generate_series(1, 400) AS i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	seen := inbox.Claim{Consumer: "c", MessageID: "seen", PayloadHash: hash("seen")}
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := ib.ClaimBatch(ctx, tx, []inbox.Claim{seen})
		return err
	}))
	// tuplesRead counts the rows this backend read from the table; a
	// backend's counts are flushed to the shared statistics at most once a
	// second, so a batch's reads are the difference across it.
	tuplesRead := func(tx pgx.Tx) (n int64) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, table).Scan(&n))
		return n
	}
	batch := func(round int) (read int64) {
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			before := tuplesRead(tx)
			claims := []inbox.Claim{seen}
			var ids []string
			for i := range 3 {
				id := fmt.Sprintf("r%d-%d", round, i)
				ids = append(ids, id)
				claims = append(claims, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id)})
			}
			res, err := ib.ClaimBatch(ctx, tx, claims)
			require.NoError(t, err)
			require.Equal(t, inbox.Duplicate, res[0].Decision)
			n, err := ib.UnclaimBatch(ctx, tx, "c", ids)
			require.NoError(t, err)
			require.EqualValues(t, 3, n)
			read = tuplesRead(tx) - before
			return nil
		}))
		return read
	}
	for round := range 8 { // past the five executions after which a generic plan may stick
		batch(round)
	}
	const grown = 20000
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash)
SELECT 'c', 'old-' || i, sha256(i::text::bytea) FROM generate_series(1, $1::int) AS i`, grown)
	require.NoError(t, err)

	read := batch(99)
	require.Less(t, read, int64(100), "a batch of 4 keys read %d rows of a scope of %d", read, grown)
}
