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

// DeleteFrom starts each chunk from the key the chunk before it returned,
// never from the start again, and ends at the first short chunk.
func TestDeleteFromStartsEachChunkWhereTheOneBeforeStopped(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	table, starts := tables.Table("aged"), tables.Table("starts")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (at timestamptz NOT NULL);
		CREATE TABLE `+starts+` (n serial, at timestamptz NOT NULL);
		INSERT INTO `+table+` SELECT timestamptz '2020-01-01 00:00:00+00' + i * interval '1 minute' FROM generate_series(1, 25) AS i;
		INSERT INTO `+table+` SELECT now() FROM generate_series(1, 5)`)
	require.NoError(t, err)
	sql := `WITH doomed AS (
	SELECT ctid FROM ` + table + ` WHERE at >= $3 AND at < $1 ORDER BY at LIMIT $2
), gone AS (
	DELETE FROM ` + table + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed)) RETURNING at
), started AS (
	INSERT INTO ` + starts + ` (at) VALUES ($3)
)
SELECT count(*), coalesce(max(at), $3) FROM gone`

	n, err := chunked.DeleteFrom(ctx, pool, sql, time.Now().Add(-time.Hour), 10, 1, time.Time{})
	require.NoError(t, err)
	require.Equal(t, []int64{25}, n, "three chunks: 10, 10 and a short 5")
	rows, err := pool.Query(ctx, `SELECT at FROM `+starts+` ORDER BY n`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	minute := func(i int) time.Time { return time.Date(2020, 1, 1, 0, i, 0, 0, time.UTC) }
	require.Len(t, got, 3)
	require.True(t, got[0].IsZero() || got[0].Year() == 1, "the first chunk starts from the oldest row: %s", got[0])
	require.True(t, minute(10).Equal(got[1]), "%s", got[1])
	require.True(t, minute(20).Equal(got[2]), "%s", got[2])

	_, err = chunked.DeleteFrom(ctx, pool, sql, time.Now(), 0, 1, time.Time{})
	require.Error(t, err, "a chunk size of 0 would never end")
}
