package inbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
)

func TestCleanupRecordsTheHighestForgottenOffsetPerConsumerAndSource(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	const day = 24 * time.Hour
	// Consumer a read offsets 0..9 of stream s; b read a queue.
	var claims []inbox.Claim
	for i := range int64(10) {
		off := i
		claims = append(claims, inbox.Claim{Consumer: "a", MessageID: ids("s", 10)[i], PayloadHash: hash(ids("s", 10)[i]),
			Source: "s", StreamOffset: &off})
	}
	claims = append(claims, inbox.Claim{Consumer: "b", MessageID: "q-1", PayloadHash: hash("q-1"), Source: "q"})
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.ClaimBatch(ctx, tx, claims)
		return err
	}))
	_, err := pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+
		" SET received_at = now() - interval '10 days' WHERE stream_offset < 6 OR consumer = 'b'")
	require.NoError(t, err)

	_, ok, err := ib.Horizon(ctx, pool, "a", "s")
	require.NoError(t, err)
	require.False(t, ok, "nothing forgotten before a cleanup")

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 4})
	require.NoError(t, err)
	require.Equal(t, int64(7), res.Deleted)

	h, ok, err := ib.Horizon(ctx, pool, "a", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.NotNil(t, h.Offset)
	require.Equal(t, int64(5), *h.Offset, "offsets 0..5 were deleted, over two chunks")
	require.WithinDuration(t, time.Now().Add(-10*day), h.SeenAt, time.Hour)

	h, ok, err = ib.Horizon(ctx, pool, "b", "q")
	require.NoError(t, err)
	require.True(t, ok)
	require.Nil(t, h.Offset, "queue messages have no offset")

	// A later cleanup moves the horizon forward.
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+
		" SET received_at = now() - interval '8 days' WHERE stream_offset = 6")
	require.NoError(t, err)
	_, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day})
	require.NoError(t, err)
	h, _, err = ib.Horizon(ctx, pool, "a", "s")
	require.NoError(t, err)
	require.Equal(t, int64(6), *h.Offset)
	require.WithinDuration(t, time.Now().Add(-8*day), h.SeenAt, time.Hour)

	// A cleanup of older rows (another source's, or stragglers) never moves
	// it back, nor writes it: every write leaves a dead version that every
	// later read of the horizon reads again while a snapshot is held open.
	version := func() (xmin string) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT xmin::text FROM "+tables.Table("inbox_horizons")+
			" WHERE consumer = 'a' AND source = 's'").Scan(&xmin))
		return xmin
	}
	before := version()
	old := int64(2)
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "a", MessageID: "late", PayloadHash: hash("late"), Source: "s", StreamOffset: &old})
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+" SET received_at = now() - interval '30 days' WHERE message_id = 'late'")
	require.NoError(t, err)
	res, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted)
	h2, _, err := ib.Horizon(ctx, pool, "a", "s")
	require.NoError(t, err)
	require.Equal(t, h, h2)
	require.Equal(t, before, version(), "a horizon that does not move is not written")
}

// Touch records a sighting now: an expired row it touches outlives the next
// clean-up; a row that does not exist, or a key no row can have, reports
// false.
func TestTouchedRowOutlivesTheNextCleanUp(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.ClaimBatch(ctx, tx, []inbox.Claim{
			{Consumer: "a", MessageID: "kept", PayloadHash: hash("kept")},
			{Consumer: "a", MessageID: "gone", PayloadHash: hash("gone")}})
		return err
	}))
	_, err := pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+" SET received_at = now() - interval '10 days'")
	require.NoError(t, err)

	found, err := ib.Touch(ctx, pool, "a", "kept")
	require.NoError(t, err)
	require.True(t, found)
	for _, id := range []string{"never", ""} {
		found, err = ib.Touch(ctx, pool, "a", id)
		require.NoError(t, err)
		require.False(t, found, id)
	}
	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted, "only the row not touched goes")
	_, err = ib.Lookup(ctx, pool, "a", "kept")
	require.NoError(t, err)
}
