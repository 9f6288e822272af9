package inbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The batch claims work in every pgx query exec mode, the exec and
// simple-protocol modes (PgBouncer's) included, where parameters travel
// without their PostgreSQL type: same decisions, same rows, NULL for an
// empty business key, and an unclaim removes this transaction's rows only.
func TestBatchClaimsWorkInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			p := testdb.WithExecMode(t, pool, mode)
			consumer := "c-" + mode.String()
			off := int64(7)
			claimed := []inbox.Claim{
				{Consumer: consumer, MessageID: "m-1", PayloadHash: hash("a"), BusinessKey: "order-ü", Source: "q"},
				{Consumer: consumer, MessageID: "m-2", PayloadHash: hash("b"), Source: "s", StreamOffset: &off},
			}
			require.NoError(t, pgx.BeginFunc(t.Context(), p, func(tx pgx.Tx) error {
				res, err := ib.ClaimNewBatch(t.Context(), tx, claimed)
				require.Equal(t, []inbox.Result{
					{Decision: inbox.NewMessage, StoredHash: hash("a")}, {Decision: inbox.NewMessage, StoredHash: hash("b")},
				}, res)
				return err
			}))
			require.NoError(t, pgx.BeginFunc(t.Context(), p, func(tx pgx.Tx) error {
				res, err := ib.ClaimBatch(t.Context(), tx, []inbox.Claim{
					{Consumer: consumer, MessageID: "m-1", PayloadHash: hash("a")},
					{Consumer: consumer, MessageID: "m-2", PayloadHash: hash("x")},
					{Consumer: consumer, MessageID: "m-3", PayloadHash: hash("c")},
				})
				require.Equal(t, []inbox.Result{
					{Decision: inbox.Duplicate, StoredHash: hash("a")},
					{Decision: inbox.Conflict, StoredHash: hash("b")},
					{Decision: inbox.NewMessage, StoredHash: hash("c")},
				}, res)
				return err
			}))
			rec, err := ib.Lookup(t.Context(), p, consumer, "m-1")
			require.NoError(t, err)
			require.Equal(t, "order-ü", rec.BusinessKey)
			require.Equal(t, "q", rec.Source)
			rec, err = ib.Lookup(t.Context(), p, consumer, "m-2")
			require.NoError(t, err)
			require.Equal(t, &off, rec.StreamOffset)
			var nulls int
			require.NoError(t, p.QueryRow(t.Context(), `SELECT count(*) FROM `+tables.Table("inbox")+
				` WHERE consumer = $1 AND business_key IS NULL`, consumer).Scan(&nulls))
			require.Equal(t, 2, nulls, "m-2 and m-3 have no business key")
			require.NoError(t, pgx.BeginFunc(t.Context(), p, func(tx pgx.Tx) error {
				_, err := ib.ClaimNewBatch(t.Context(), tx, []inbox.Claim{{Consumer: consumer, MessageID: "m-4", PayloadHash: hash("d")}})
				require.NoError(t, err)
				n, err := ib.UnclaimBatch(t.Context(), tx, consumer, []string{"m-1", "m-4"})
				require.EqualValues(t, 1, n, "only m-4 was claimed by this transaction")
				return err
			}))
		})
	}
}
