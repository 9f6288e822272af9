package rowcount_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/rowcount"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// A value with few rows is counted exactly; one the statistics put at Cap
// rows or more is estimated, without reading its rows; a table never
// analysed is counted exactly, up to Cap.
func TestARareValueIsCountedAndACommonOneEstimated(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := t.Context()
	table := tables.Table("rowcount_probe")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (v text NOT NULL) WITH (autovacuum_enabled = false);
		CREATE INDEX ON `+table+` (v);
		INSERT INTO `+table+` SELECT CASE WHEN i <= 7 THEN 'rare' ELSE 'common' END FROM generate_series(1, 20000) AS i`)
	require.NoError(t, err)
	reads := 0
	count := func(value string) func(ctx context.Context, limit int) (int64, error) {
		return func(ctx context.Context, limit int) (int64, error) {
			reads++
			var n int64
			err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+table+` WHERE v = $1 LIMIT $2) AS c`, value, limit).Scan(&n)
			return n, err
		}
	}

	fresh, err := rowcount.ReadStats(ctx, pool, table, "v")
	require.NoError(t, err)
	c, err := fresh.Of(ctx, "common", count("common"))
	require.NoError(t, err)
	require.Equal(t, rowcount.Count{N: rowcount.Cap, Estimated: true}, c, "never analysed: counted up to the cap")

	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	analysed, err := rowcount.ReadStats(ctx, pool, table, "v")
	require.NoError(t, err)
	reads = 0
	c, err = analysed.Of(ctx, "common", count("common"))
	require.NoError(t, err)
	require.True(t, c.Estimated)
	require.InDelta(t, 19993, c.N, 200, "the estimate scales the sampled frequency to the table")
	require.Zero(t, reads, "an estimate reads no row")
	c, err = analysed.Of(ctx, "rare", count("rare"))
	require.NoError(t, err)
	require.Equal(t, rowcount.Count{N: 7}, c)
	c, err = analysed.Of(ctx, "absent", count("absent"))
	require.NoError(t, err)
	require.Equal(t, rowcount.Count{N: 0}, c)
}

// A partitioned table's parent has no statistics (autovacuum analyses
// its partitions only): the estimate is the sum of its partitions', and a
// partition not analysed yet leaves the others' estimate standing.
func TestAPartitionedTableIsEstimatedFromItsPartitions(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := t.Context()
	table := tables.Table("rowcount_parts")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (v text NOT NULL, p int NOT NULL) PARTITION BY RANGE (p);
		CREATE TABLE `+tables.Table("rowcount_parts_a")+` PARTITION OF `+table+` FOR VALUES FROM (0) TO (10) WITH (autovacuum_enabled = false);
		CREATE TABLE `+tables.Table("rowcount_parts_b")+` PARTITION OF `+table+` FOR VALUES FROM (10) TO (20) WITH (autovacuum_enabled = false);
		CREATE TABLE `+tables.Table("rowcount_parts_c")+` PARTITION OF `+table+` FOR VALUES FROM (20) TO (30) WITH (autovacuum_enabled = false);
		INSERT INTO `+table+` SELECT CASE WHEN i % 4 = 0 THEN 'rare' ELSE 'common' END, 5 FROM generate_series(1, 8000) AS i;
		INSERT INTO `+table+` SELECT 'common', 15 FROM generate_series(1, 6000);
		INSERT INTO `+table+` SELECT 'common', 25 FROM generate_series(1, 500);
		ANALYZE `+tables.Table("rowcount_parts_a")+`; ANALYZE `+tables.Table("rowcount_parts_b"))
	require.NoError(t, err)
	reads := 0
	count := func(ctx context.Context, limit int) (int64, error) { reads++; return 0, nil }
	s, err := rowcount.ReadStats(ctx, pool, table, "v")
	require.NoError(t, err)
	c, err := s.Of(ctx, "common", count)
	require.NoError(t, err)
	require.True(t, c.Estimated)
	require.InDelta(t, 6000+6000, c.N, 300, "the analysed partitions' estimates, summed; the third is not analysed yet")
	c, err = s.Of(ctx, "rare", count)
	require.NoError(t, err)
	require.True(t, c.Estimated)
	require.InDelta(t, 2000, c.N, 200)
	require.Zero(t, reads, "estimates read no row")
}
