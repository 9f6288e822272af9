//go:build scale

package chunked_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// Invariant 18 for OlderThan's walk (the dead letters' and the attempts'
// clean-ups): a million expired rows, in batches of 100 sharing one
// timestamp, beside younger ones, deleted with a snapshot held open, each
// read about once, in custom and generic plans. Run by `make scale`.
func TestScaleOlderThanReadsEachRowOnceUnderAnOpenSnapshot(t *testing.T) {
	for _, mode := range []string{testdb.CustomPlans, testdb.GenericPlans} {
		t.Run(mode, func(t *testing.T) {
			_, tables := testdb.Schema(t)
			pool := testdb.PlanPool(t, mode)
			ctx := context.Background()
			table := tables.Table("aged")
			_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id bigint PRIMARY KEY, at timestamptz NOT NULL, body text NOT NULL);
				INSERT INTO `+table+` SELECT i, now() - interval '30 days' + (i / 100) * interval '1 second', 'dead letter ' || i
				FROM generate_series(1, 1200000) AS i;
				CREATE INDEX ON `+table+` (at);
				ANALYZE `+table)
			require.NoError(t, err)
			var cutoff time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT at FROM `+table+` WHERE id = 1000000`).Scan(&cutoff))
			testdb.HoldSnapshot(t)
			var n []int64
			work := testdb.NewMeter(t, tables.Schema, pool).Measure(func() {
				n, err = chunked.Delete(ctx, pool, chunked.OlderThan(table, "at"), cutoff, 1000, 1)
				require.NoError(t, err)
			})
			require.Equal(t, []int64{999_999}, n)
			work.RequirePerDeleted(t, "OlderThan")
		})
	}
}
