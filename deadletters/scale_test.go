//go:build scale

package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/timeparts"
	"github.com/idemkit/idem/migrate"
)

// Invariant 18 for the dead letters' clean-up: a million expired rows,
// deleted with a snapshot held open, each read about once, in custom and
// generic plans. Run by `make scale`.
func TestScaleDeleteBeforeReadsEachRowOnceUnderAnOpenSnapshot(t *testing.T) {
	for _, mode := range []string{testdb.CustomPlans, testdb.GenericPlans} {
		t.Run(mode, func(t *testing.T) {
			_, tables := testdb.Schema(t)
			pool := testdb.PlanPool(t, mode)
			ctx := context.Background()
			_, err := pool.Exec(ctx, `INSERT INTO `+tables.Table("dead_letters")+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
				SELECT 'c' || (i % 8), 'm-' || i, sha256(int8send(i)), 'max_attempts', now() - interval '30 days' + (i / 100) * interval '1 second'
				FROM generate_series(1, 1100000) AS i;
				ANALYZE `+tables.Table("dead_letters"))
			require.NoError(t, err)
			var cutoff time.Time // the row of the millionth, and its batch, are not expired
			require.NoError(t, pool.QueryRow(ctx, `SELECT dead_lettered_at FROM `+tables.Table("dead_letters")+
				` WHERE consumer = 'c0' AND message_id = 'm-1000000'`).Scan(&cutoff))
			testdb.HoldSnapshot(t)
			var n int64
			work := testdb.NewMeter(t, tables.Schema, pool).Measure(func() {
				n, err = deadletters.DeleteBefore(ctx, pool, tables, cutoff, 1000)
				require.NoError(t, err)
			})
			require.EqualValues(t, 999_999, n)
			work.RequirePerDeleted(t, "deadletters.DeleteBefore")
		})
	}
}

// Invariant 18 for the dead letters in time partitions (`idem migrate
// --partition-width`): 1.1M rows over 26 daily partitions, of which
// DeleteBefore drops the expired ones whole and deletes, row by row, the
// older rows of the one its cutoff falls in, with a snapshot held open.
// The counters of a dropped partition go with it (DeleteBefore reads each
// once, to count its rows): the tables left are held to the bound, per row
// deleted, in custom and generic plans. Run by `make scale`.
func TestScalePartitionedDeleteBeforeDropsWholeDaysAndReadsTheRestOnce(t *testing.T) {
	for _, mode := range []string{testdb.CustomPlans, testdb.GenericPlans} {
		t.Run(mode, func(t *testing.T) {
			_, tables := testdb.Schema(t)
			pool := testdb.PlanPool(t, mode)
			ctx := context.Background()
			_, err := migrate.UpWith(ctx, pool, tables, migrate.Options{PartitionWidth: 24 * time.Hour})
			require.NoError(t, err)
			dl := tables.Table("dead_letters")
			_, err = pool.Exec(ctx, `INSERT INTO `+dl+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
				SELECT 'c' || (i % 8), 'm-' || i, sha256(int8send(i)), 'max_attempts', now() - interval '30 days' + i * interval '2 seconds'
				FROM generate_series(1, 1100000) AS i`)
			require.NoError(t, err)
			// The rows went to the default partition: retention's first
			// step gives each day its partition.
			made, err := timeparts.New(tables, "dead_letters", "dead_lettered_at").Ensure(ctx, pool, 0)
			require.NoError(t, err)
			require.Greater(t, made, 20)
			_, err = pool.Exec(ctx, `VACUUM ANALYZE `+dl)
			require.NoError(t, err)
			var cutoff time.Time // the millionth row is not expired
			require.NoError(t, pool.QueryRow(ctx, `SELECT dead_lettered_at FROM `+dl+
				` WHERE consumer = 'c0' AND message_id = 'm-1000000'`).Scan(&cutoff))
			partitions := func() (n int) {
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1)`, dl).Scan(&n))
				return n
			}
			before := partitions()
			testdb.HoldSnapshot(t)
			var n int64
			work := testdb.NewMeter(t, tables.Schema, pool).Measure(func() {
				n, err = deadletters.DeleteBefore(ctx, pool, tables, cutoff, 1000)
				require.NoError(t, err)
			})
			require.EqualValues(t, 999_999, n)
			dropped := before - partitions()
			require.GreaterOrEqual(t, dropped, 20, "whole days dropped")
			t.Logf("dropped %d of %d partitions", dropped, before)
			work.RequirePerRow(t, "deadletters.DeleteBefore on partitions (the tables it keeps)", n)
			var left int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+dl).Scan(&left))
			require.EqualValues(t, 1_100_000-999_999, left, "every younger row is kept")
		})
	}
}
