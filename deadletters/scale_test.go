//go:build scale

package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testdb"
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
