package chunked_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/testkit/testdb"
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

// OlderThan's walk takes the rows of the key it ends on with it (rows
// written in one transaction share one now()), never a row younger than
// the cutoff, and leaves a row a transaction holds locked.
func TestOlderThanTakesTheRowsOfItsLastKeyAndSkipsLockedRows(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	table := tables.Table("aged")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, at timestamptz NOT NULL);
		CREATE INDEX ON `+table+` (at);
		INSERT INTO `+table+` SELECT i, now() - interval '2 days' + (i / 4) * interval '1 minute' FROM generate_series(1, 23) AS i;
		INSERT INTO `+table+` SELECT i, now() FROM generate_series(24, 30) AS i`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE id = 9 FOR UPDATE`)
	require.NoError(t, err)

	n, err := chunked.Delete(ctx, pool, chunked.OlderThan(table, "at"), time.Now().Add(-24*time.Hour), 5, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{22}, n, "every aged row but the locked one")
	require.NoError(t, tx.Rollback(ctx))
	var left []int
	rows, err := pool.Query(ctx, `SELECT id FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{9, 24, 25, 26, 27, 28, 29, 30}, left)
}

// Under a snapshot held open, the rows a chunk deletes stay in the index:
// no chunk of OlderThan's walk reads them again. Invariant 18 at the size
// of a unit test; `make scale` checks it on a million rows.
func TestOlderThanReadsEachRowOnceUnderAnOpenSnapshot(t *testing.T) {
	t.Parallel()
	_, tables := testdb.Schema(t)
	pool := testdb.PlanPool(t, "")
	ctx := context.Background()
	table := tables.Table("aged")
	// Rows of half a kilobyte: a scan that starts again from the first page
	// pays for the pages of the rows deleted before it.
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, at timestamptz NOT NULL, body text NOT NULL);
		CREATE INDEX ON `+table+` (at);
		INSERT INTO `+table+` SELECT i, now() - interval '20 days' + i * interval '1 second', repeat('x', 500)
		FROM generate_series(1, 20000) AS i;
		ANALYZE `+table)
	require.NoError(t, err)
	testdb.HoldSnapshot(t)
	var n []int64
	work := testdb.NewMeter(t, tables.Schema, pool).Measure(func() {
		n, err = chunked.Delete(ctx, pool, chunked.OlderThan(table, "at"), time.Now().Add(-24*time.Hour), 50, 1)
		require.NoError(t, err)
	})
	require.Equal(t, []int64{20000}, n)
	work.RequirePerRow(t, "OlderThan", n[0])
}
