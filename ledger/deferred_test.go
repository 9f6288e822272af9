package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ledger"
)

// A batch's effects recorded with a Deferred are written by one Flush, with
// the same semantics as immediate records: duplicates are no-ops and a
// different request under a recorded id is a conflict.
func TestDeferredRecordsAreWrittenAtFlushWithTheSameSemantics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	old := ledger.Effect{Type: "mail.send", BusinessKey: "old", Request: map[string]int{"v": 1}}
	f.record(t, ctx, old)

	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		d := &idem.Deferred{}
		dctx := idem.WithDeferred(ctx, d)
		for i := 0; i < 2; i++ { // the same effect twice in one batch
			e, err := f.ledger.Record(dctx, tx, ledger.Effect{Type: "mail.send", BusinessKey: "new", Request: map[string]int{"v": 2}})
			require.NoError(t, err)
			require.Equal(t, ledger.StatusPending, e.Status)
		}
		_, err := f.ledger.Record(dctx, tx, ledger.Effect{Type: "mail.send", BusinessKey: "new", Request: map[string]int{"v": 3}})
		require.ErrorIs(t, err, ledger.ErrEffectConflict, "a conflict inside the batch is found at once")
		_, err = f.ledger.Record(dctx, tx, old) // recorded before, same request: a no-op
		require.NoError(t, err)

		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("ledger")).Scan(&n))
		require.Equal(t, 1, n, "nothing is written before the flush")
		require.NoError(t, d.Flush(ctx, tx))
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("ledger")).Scan(&n))
		require.Equal(t, 2, n)
		return nil
	})
	require.NoError(t, err)

	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		d := &idem.Deferred{}
		changed := old
		changed.Request = map[string]int{"v": 99}
		_, err := f.ledger.Record(idem.WithDeferred(ctx, d), tx, changed)
		require.NoError(t, err, "the stored effect is only compared at the flush")
		require.ErrorIs(t, d.Flush(ctx, tx), ledger.ErrEffectConflict)
		return nil
	})
	require.NoError(t, err)
}
