package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
)

func TestClaimNewBatchClaimsNewMessagesAndDecidesRepeatsInTheBatch(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	off := int64(7)
	claims := []inbox.Claim{
		{Consumer: "c", MessageID: "m-2", PayloadHash: hash("b"), BusinessKey: "k", Source: "s", StreamOffset: &off},
		{Consumer: "c", MessageID: "m-1", PayloadHash: hash("a")},
		{Consumer: "c", MessageID: "m-2", PayloadHash: hash("b")}, // repeated, same payload
		{Consumer: "c", MessageID: "m-1", PayloadHash: hash("x")}, // repeated, other payload
	}
	var got []inbox.Result
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		var err error
		got, err = ib.ClaimNewBatch(t.Context(), tx, claims)
		return err
	}))
	require.Equal(t, []inbox.Result{
		{Decision: inbox.NewMessage, StoredHash: hash("b")},
		{Decision: inbox.NewMessage, StoredHash: hash("a")},
		{Decision: inbox.Duplicate, StoredHash: hash("b")},
		{Decision: inbox.Conflict, StoredHash: hash("a")},
	}, got)
	rec, err := ib.Lookup(t.Context(), pool, "c", "m-2")
	require.NoError(t, err)
	require.Equal(t, hash("b"), rec.PayloadHash)
	require.Equal(t, "k", rec.BusinessKey)
	require.EqualValues(t, 7, *rec.StreamOffset)

	// ClaimBatch agrees that they are claimed now.
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, claims[1]).Decision)
}

func TestClaimNewBatchFailsWithErrClaimedWhenAMessageIsClaimedAlready(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "old", PayloadHash: hash("a")})
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // the test rolls back itself
	_, err = ib.ClaimNewBatch(ctx, tx, []inbox.Claim{
		{Consumer: "c", MessageID: "new", PayloadHash: hash("n")},
		{Consumer: "c", MessageID: "old", PayloadHash: hash("a")},
	})
	require.ErrorIs(t, err, inbox.ErrClaimed)
	require.Equal(t, byte('E'), tx.Conn().PgConn().TxStatus(), "the transaction is aborted")
	require.NoError(t, tx.Rollback(ctx))
	_, err = ib.Lookup(ctx, pool, "c", "new")
	require.ErrorIs(t, err, inbox.ErrNotFound, "nothing of the failed batch was kept")
}

func TestClaimNewBatchWaitsForAConcurrentClaimOfTheSameID(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "it commits: ErrClaimed", false: "it rolls back: new"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, ib, _ := setup(t)
			ctx := t.Context()
			first, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer first.Rollback(context.Background()) //nolint:errcheck // no-op after commit
			_, err = ib.ClaimNewBatch(ctx, first, []inbox.Claim{{Consumer: "c", MessageID: "m", PayloadHash: hash("a")}})
			require.NoError(t, err)

			second, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer second.Rollback(context.Background()) //nolint:errcheck // no-op after commit
			pid := second.Conn().PgConn().PID()
			done := make(chan error, 1)
			go func() {
				_, err := ib.ClaimNewBatch(ctx, second, []inbox.Claim{{Consumer: "c", MessageID: "m", PayloadHash: hash("a")}})
				done <- err
			}()
			waitForLockWait(t, pool, pid)
			if commit {
				require.NoError(t, first.Commit(ctx))
				require.ErrorIs(t, <-done, inbox.ErrClaimed)
				return
			}
			require.NoError(t, first.Rollback(ctx))
			require.NoError(t, <-done)
			require.NoError(t, second.Commit(ctx))
			_, err = ib.Lookup(ctx, pool, "c", "m")
			require.NoError(t, err)
		})
	}
}

func TestClaimNewBatchRejectsInvalidClaimsBeforeSending(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // read-only use
	_, err = ib.ClaimNewBatch(t.Context(), tx, []inbox.Claim{{Consumer: "c", MessageID: "", PayloadHash: hash("a")}})
	var ve *inbox.ValidationError
	require.True(t, errors.As(err, &ve), "got %v", err)
	require.Equal(t, byte('T'), tx.Conn().PgConn().TxStatus(), "nothing was sent")
}
