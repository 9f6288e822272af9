package chunked_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/testdb"
)

// Delete goes on chunk after chunk until one comes back short, and deletes
// only what is older than the cutoff.
func TestDeleteRunsChunksUntilOneIsShortAndKeepsNewerRows(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	table := tables.Table("aged")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int, at timestamptz NOT NULL);
		INSERT INTO `+table+` SELECT i, now() - interval '2 days' FROM generate_series(1, 25) AS i;
		INSERT INTO `+table+` SELECT i, now() FROM generate_series(26, 30) AS i`)
	require.NoError(t, err)

	n, err := chunked.Delete(ctx, pool, chunked.OlderThan(table, "at"), time.Now().Add(-24*time.Hour), 10, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{25}, n, "three chunks: 10, 10 and a short 5")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&left))
	require.Equal(t, 5, left)

	_, err = chunked.Delete(ctx, pool, chunked.OlderThan(table, "at"), time.Now(), 0, 1)
	require.Error(t, err, "a chunk size of 0 would never end")
}
