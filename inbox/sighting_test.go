package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
)

const day = 24 * time.Hour

func at(off int64) *int64 { return &off }

// A stream that holds each event twice (offsets 2i and 2i+1): the horizon
// retention records counts the second copy, so that a replay from 2i+1 is
// refused — the first copy's offset alone would let it apply event i again.
func TestHorizonCountsEveryCopyNotOnlyTheFirst(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	for i := range int64(5) {
		id := fmt.Sprintf("e-%d", i)
		require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id,
			PayloadHash: hash(id), Source: "s", StreamOffset: at(2 * i)}).Decision)
		require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id,
			PayloadHash: hash(id), Source: "s", StreamOffset: at(2*i + 1)}).Decision)
	}
	// A conflicting copy of e-0 much later in the stream is a sighting too.
	require.Equal(t, inbox.Conflict, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "e-0",
		PayloadHash: hash("other"), Source: "s", StreamOffset: at(11)}).Decision)
	rec, err := ib.Lookup(ctx, pool, "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, int64(2), *rec.StreamOffset, "the first copy's offset stays")
	require.Equal(t, int64(3), *rec.SeenOffset, "the last copy's offset")
	require.NotNil(t, rec.SeenAt)

	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+` SET received_at = now() - interval '10 days',
		seen_at = now() - interval '9 days' WHERE message_id IN ('e-0', 'e-1', 'e-2')`)
	require.NoError(t, err)
	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted)

	h, ok, err := ib.Horizon(ctx, pool, "c", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(11), *h.Offset, "e-0's conflicting copy at 11 was its last sighting")
	require.WithinDuration(t, time.Now().Add(-9*day), h.SeenAt, time.Hour)

	err = ib.CheckOffset(ctx, pool, "c", "s", 11)
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	var he *inbox.HorizonError
	require.ErrorAs(t, err, &he)
	require.Contains(t, err.Error(), "start at 12 or later")
	require.NoError(t, ib.CheckOffset(ctx, pool, "c", "s", 12))
	require.NoError(t, ib.CheckOffset(ctx, pool, "c", "other-stream", 0), "another source's offsets are not this one's")
	require.NoError(t, ib.CheckOffset(ctx, pool, "d", "s", 0), "another consumer forgot nothing")

	require.ErrorIs(t, ib.CheckSeen(ctx, pool, "c", time.Now().Add(-10*day)), inbox.ErrBeyondHorizon)
	require.NoError(t, ib.CheckSeen(ctx, pool, "c", time.Now().Add(-8*day)))
	require.NoError(t, ib.CheckSeen(ctx, pool, "d", time.Now().Add(-30*day)))
}

// A message that keeps coming back keeps its row: retention counts a row's
// age from its last sighting, not from its first receipt.
func TestCleanupKeepsARowWhoseMessageWasSeenRecently(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "back", PayloadHash: hash("back"), Source: "q"})
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "gone", PayloadHash: hash("gone"), Source: "q"})
	_, err := pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+" SET received_at = now() - interval '10 days'")
	require.NoError(t, err)
	require.Equal(t, inbox.Conflict, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "back",
		PayloadHash: hash("another payload"), Source: "q"}).Decision)

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted)
	_, err = ib.Lookup(ctx, pool, "c", "back")
	require.NoError(t, err, "seen a moment ago: kept")
	_, err = ib.Lookup(ctx, pool, "c", "gone")
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

// Unclaim takes back only a row its transaction inserted, never a row
// committed before whose sighting the transaction recorded.
func TestUnclaimNeverDeletesARowWhoseSightingItRecorded(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	ctx := t.Context()
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "old", PayloadHash: hash("old")})
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := ib.ClaimBatch(ctx, tx, []inbox.Claim{
			{Consumer: "c", MessageID: "old", PayloadHash: hash("old")},
			{Consumer: "c", MessageID: "new", PayloadHash: hash("new")},
		})
		require.NoError(t, err)
		require.Equal(t, []inbox.Decision{inbox.Duplicate, inbox.NewMessage}, []inbox.Decision{got[0].Decision, got[1].Decision})
		require.ErrorIs(t, ib.Unclaim(ctx, tx, "c", "old"), inbox.ErrNotClaimed)
		n, err := ib.UnclaimBatch(ctx, tx, "c", []string{"old", "new"})
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "only the row this transaction inserted")
		return nil
	})
	require.NoError(t, err)
	_, err = ib.Lookup(ctx, pool, "c", "old")
	require.NoError(t, err)
}

// A held scope — an online rebuild's own inbox — is never cleaned, however
// old its rows; DeleteScope refuses it until it is released.
func TestCleanupNeverTouchesAHeldScope(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	seed(t, pool, ib, tables, "live", 10*day, ids("l", 3)...)
	seed(t, pool, ib, tables, "live@rebuild:r1", 10*day, ids("r", 4)...)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ib.Hold(ctx, tx, "live@rebuild:r1", "online rebuild r1")
	}))
	held, err := ib.Held(ctx, pool, "live@rebuild:r1")
	require.NoError(t, err)
	require.True(t, held)

	res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 7 * day, ChunkSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted, "the live scope's rows only")
	_, ok, err := ib.Horizon(ctx, pool, "live@rebuild:r1", "")
	require.NoError(t, err)
	require.False(t, ok, "the held scope forgot nothing")
	_, err = ib.DeleteScope(ctx, pool, "live@rebuild:r1")
	require.ErrorIs(t, err, inbox.ErrHeld)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ib.Release(ctx, tx, "live@rebuild:r1")
	}))
	n, err := ib.DeleteScope(ctx, pool, "live@rebuild:r1")
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
}

// DeleteScope removes a scope of any size in key-ordered chunks and leaves
// every other scope alone.
func TestDeleteScopeDeletesEveryRowOfTheScopeOnly(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "INSERT INTO "+tables.Table("inbox")+` (consumer, message_id, payload_hash)
		SELECT c, 'm-' || i, sha256(i::text::bytea) FROM generate_series(1, 12001) AS i, unnest(ARRAY['gone', 'kept']) AS c`)
	require.NoError(t, err)
	n, err := ib.DeleteScope(ctx, pool, "gone")
	require.NoError(t, err)
	require.Equal(t, int64(12001), n, "three chunks of 5,000")
	var consumer string
	var left int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(consumer), count(*) FROM "+tables.Table("inbox")).Scan(&consumer, &left))
	require.Equal(t, "kept", consumer)
	require.Equal(t, int64(12001), left)
}

// A copy met in the same batch as the first is a sighting too, whichever
// claim statement inserts the row.
func TestARepeatInTheSameBatchIsASighting(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	ctx := t.Context()
	batch := []inbox.Claim{
		{Consumer: "c", MessageID: "a", PayloadHash: hash("a"), Source: "s", StreamOffset: at(0)},
		{Consumer: "c", MessageID: "a", PayloadHash: hash("a"), Source: "s", StreamOffset: at(1)},
		{Consumer: "c", MessageID: "b", PayloadHash: hash("b"), Source: "s", StreamOffset: at(2)},
		{Consumer: "c", MessageID: "a", PayloadHash: hash("x"), Source: "s", StreamOffset: at(3)},
	}
	for name, claim := range map[string]func(context.Context, pgx.Tx, []inbox.Claim) ([]inbox.Result, error){
		"ClaimBatch": ib.ClaimBatch, "ClaimNewBatch": ib.ClaimNewBatch,
	} {
		scope := "c-" + name
		for i := range batch {
			batch[i].Consumer = scope
		}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			got, err := claim(ctx, tx, batch)
			require.NoError(t, err)
			require.Equal(t, []inbox.Decision{inbox.NewMessage, inbox.Duplicate, inbox.NewMessage, inbox.Conflict},
				[]inbox.Decision{got[0].Decision, got[1].Decision, got[2].Decision, got[3].Decision}, name)
			return nil
		}))
		rec, err := ib.Lookup(ctx, pool, scope, "a")
		require.NoError(t, err)
		require.Equal(t, int64(0), *rec.StreamOffset, name)
		require.Equal(t, int64(3), *rec.SeenOffset, name)
		require.Nil(t, rec.SeenAt, "%s: the copies came with the first", name)
		rec, err = ib.Lookup(ctx, pool, scope, "b")
		require.NoError(t, err)
		require.Nil(t, rec.SeenOffset, name)
	}
}

// A DeleteScope chunk runs from after the last key the chunk before it
// deleted (TestEachChunkStartsAfterTheLastKeyOfTheOneBefore). While an open
// snapshot (a live worker's, a reader's) keeps the deleted rows' index
// entries from being marked dead, its statement after the last key of an
// emptied scope reads a few pages, where one from the start of the scope
// rereads every entry deleted before it: with the bound, the clean-up's
// time grows with the rows, not their square.
func TestDeleteScopeStatementAfterTheLastKeySkipsTheRowsDeletedBeforeIt(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "INSERT INTO "+tables.Table("inbox")+` (consumer, message_id, payload_hash)
		SELECT 'scope', 'm-' || lpad(i::text, 6, '0'), sha256(i::text::bytea) FROM generate_series(1, 100000) AS i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE "+tables.Table("inbox"))
	require.NoError(t, err)
	snapshot, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = snapshot.Rollback(context.Background()) }()
	_, err = snapshot.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM "+tables.Table("inbox"))
	require.NoError(t, err)
	n, err := ib.DeleteScope(ctx, pool, "scope")
	require.NoError(t, err)
	require.EqualValues(t, 100000, n)

	buffers := func(after string) int {
		t.Helper()
		var plan []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		require.NoError(t, pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+inbox.DeleteScopeStatement(ib),
			"scope", after, inbox.ScopeChunk).Scan(&plan))
		require.Len(t, plan, 1)
		return plan[0].Plan.Hit + plan[0].Plan.Read
	}
	fromBound, fromStart := buffers("m-100000"), buffers("")
	t.Logf("buffers of a chunk on the emptied scope: %d after the last key, %d from the start", fromBound, fromStart)
	require.Less(t, fromBound*20, fromStart, "the chunk after the last key skips the 100,000 entries deleted before it")
}
