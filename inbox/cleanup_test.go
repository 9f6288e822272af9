package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// seed commits one claim per id for consumer and sets its received_at to age
// ago.
func seed(t *testing.T, pool *pgxpool.Pool, ib *inbox.Inbox, tables idem.Tables, consumer string, age time.Duration, ids ...string) {
	t.Helper()
	claims := make([]inbox.Claim, len(ids))
	for i, id := range ids {
		claims[i] = inbox.Claim{Consumer: consumer, MessageID: id, PayloadHash: hash(id)}
	}
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		if _, err := ib.ClaimBatch(t.Context(), tx, claims); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), "UPDATE "+tables.Table("inbox")+
			" SET received_at = now() - $1::bigint * interval '1 second' WHERE consumer = $2 AND message_id = ANY($3)",
			int64(age/time.Second), consumer, ids)
		return err
	})
	require.NoError(t, err)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func TestCleanupDeletesOnlyExpiredRowsInChunks(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	const day = 24 * time.Hour
	for i, id := range ids("old", 5) { // five receipts, one row each
		seed(t, pool, ib, tables, "a", 10*day+time.Duration(i)*time.Minute, id)
	}
	seed(t, pool, ib, tables, "a", 6*day, ids("young", 2)...)
	seed(t, pool, ib, tables, "b", 10*day, ids("old", 3)...)
	seed(t, pool, ib, tables, "b", 0, ids("now", 1)...)

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 2, Consumer: "a"})
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 5, Chunks: 3}, res, "5 rows in chunks of 2")

	stats, err := ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, int64(2), stats[0].Rows, "consumer a keeps its young rows")
	require.Equal(t, int64(4), stats[1].Rows, "consumer b is untouched")

	res, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 3})
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 3, Chunks: 1}, res)

	res, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day})
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{}, res, "nothing left to expire")

	stats, err = ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []int64{2, 1}, []int64{stats[0].Rows, stats[1].Rows})
	for _, id := range ids("young", 2) {
		_, err := ib.Lookup(ctx, pool, "a", id)
		require.NoError(t, err)
	}
}

// Rows claimed in one transaction share one receipt; a chunk takes every
// row of the receipt it ends on, so that the next one starts after it and
// never reads again the rows deleted before it.
func TestCleanupDeletesTheRowsOfOneReceiptInOneChunk(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	const day = 24 * time.Hour
	seed(t, pool, ib, tables, "a", 11*day, "first")
	seed(t, pool, ib, tables, "a", 10*day, ids("batch", 5)...)
	seed(t, pool, ib, tables, "a", 9*day, "last")

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 2})
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 7, Chunks: 2}, res, "last and the batch of five, then first")
	stats, err := ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, stats)
}

// A chunk whose rows are all kept (held, seen again, another consumer's)
// does not end the walk: the rows after them are still deleted.
func TestCleanupWalksPastChunksOfKeptRows(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	const day = 24 * time.Hour
	// The walk goes from the newest expired row to the oldest.
	for i, id := range ids("held", 4) {
		seed(t, pool, ib, tables, "live@rebuild:r1", 10*day+time.Duration(i)*time.Minute, id)
	}
	for i, id := range ids("other", 3) {
		seed(t, pool, ib, tables, "b", 15*day+time.Duration(i)*time.Minute, id)
	}
	for i, id := range ids("old", 3) {
		seed(t, pool, ib, tables, "a", 20*day+time.Duration(i)*time.Minute, id)
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ib.Hold(ctx, tx, "live@rebuild:r1", "online rebuild r1")
	}))

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 2, Consumer: "a"})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted, "a's rows, after three chunks of others' rows")
	stats, err := ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, []int64{3, 4}, []int64{stats[0].Rows, stats[1].Rows}, "b and the held scope are kept")
}

func TestCleanupRefusesRetentionBelowFloor(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	seed(t, pool, ib, tables, "a", 2*time.Hour, "m")

	for _, older := range []time.Duration{0, time.Hour, 168 * time.Minute, inbox.DefaultFloor - time.Second} {
		_, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: older})
		require.ErrorIs(t, err, inbox.ErrRetentionTooShort, "%v", older)
		var ve *inbox.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, "OlderThan", ve.Field)
	}
	_, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Hour, Floor: 2 * time.Hour})
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)

	_, err = ib.Lookup(ctx, pool, "a", "m")
	require.NoError(t, err, "a refused cleanup deletes nothing")

	// A deliberately lowered floor is honoured.
	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Hour, Floor: time.Hour})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted)
}

func TestStatsAndLookupReportRows(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()

	stats, err := ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, stats)

	seed(t, pool, ib, tables, "b", 48*time.Hour, "x")
	seed(t, pool, ib, tables, "b", 0, "y", "z")
	seed(t, pool, ib, tables, "a", time.Hour, "x")
	stats, err = ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, "a", stats[0].Consumer)
	require.Equal(t, int64(1), stats[0].Rows)
	require.Equal(t, stats[0].Oldest, stats[0].Newest)
	require.Equal(t, "b", stats[1].Consumer)
	require.Equal(t, int64(3), stats[1].Rows)
	require.InDelta(t, (48 * time.Hour).Seconds(), stats[1].Newest.Sub(stats[1].Oldest).Seconds(), 60)

	rec, err := ib.Lookup(ctx, pool, "b", "x")
	require.NoError(t, err)
	require.Equal(t, hash("x"), rec.PayloadHash)
	_, err = ib.Lookup(ctx, pool, "a", "y")
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

// Under a snapshot held open, the rows a chunk deletes stay in the index:
// no chunk reads them again. Invariant 18 at the size of a unit test; `make
// scale` checks it on a million rows.
func TestCleanupReadsEachRowOnceUnderAnOpenSnapshot(t *testing.T) {
	t.Parallel()
	_, ib, tables := setup(t)
	pool := testdb.PlanPool(t, "")
	_, err := pool.Exec(t.Context(), `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash, received_at)
SELECT 'c' || (i % 3), 'm-' || i, sha256(int8send(i)), now() - interval '20 days' + i * interval '1 second'
FROM generate_series(1, 10000) AS i;
ANALYZE `+tables.Table("inbox"))
	require.NoError(t, err)
	testdb.HoldSnapshot(t)
	var res inbox.CleanupResult
	work := testdb.NewMeter(t, tables.Schema, pool).Measure(func() {
		res, err = ib.Cleanup(t.Context(), pool, inbox.CleanupOptions{OlderThan: 7 * 24 * time.Hour, ChunkSize: 100})
		require.NoError(t, err)
	})
	require.EqualValues(t, 10000, res.Deleted)
	work.RequirePerRow(t, "inbox cleanup", res.Deleted)
}
