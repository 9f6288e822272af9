//go:build scale

package inbox_test

import (
	"context"
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

// Invariant 18 for the inbox: every statement that reads its history does
// work in proportion to what it returns or deletes, on a table of 1M+ rows
// with a snapshot held open, in custom and generic plans. Run by `make
// scale` (go test -tags scale).

const (
	// consumers is how many live consumers share the filled inbox.
	consumers = 8
	// held is the scope of an online rebuild under a Hold.
	held = "c0@rebuild:r1"
)

// fillInbox fills tables' inbox with expired rows, received from 30 to 8
// days ago in transactions of 100 rows (one receipt each), over consumers
// c0..c7, every 500th of them seen again a day ago and every 997th in the
// held scope; and with young rows, received in the last six days. It
// analyzes the table and returns how many rows a cleanup of rows older than
// seven days deletes.
func fillInbox(t *testing.T, pool *pgxpool.Pool, ib *inbox.Inbox, tables idem.Tables, expired, young int) int64 {
	t.Helper()
	ctx := t.Context()
	table := tables.Table("inbox")
	start := time.Now()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash, source, stream_offset, received_at, seen_at)
SELECT CASE WHEN i % 997 = 0 THEN $3 ELSE 'c' || (i % $4) END, 'm-' || i, sha256(int8send(i)), 'orders', i,
	now() - interval '30 days' + (i / 100) * ((interval '22 days') / ($1 / 100 + 1)),
	CASE WHEN i % 500 = 0 THEN now() - interval '1 day' END
FROM generate_series(1, $1::bigint) AS i
UNION ALL
SELECT 'c' || (i % $4), 'y-' || i, sha256(int8send(i)), 'orders', $1 + i,
	now() - interval '6 days' + (i / 100) * ((interval '6 days') / ($2 / 100 + 1)), NULL
FROM generate_series(1, $2::bigint) AS i`, expired, young, held, consumers)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ib.Hold(ctx, tx, held, "online rebuild r1")
	}))
	var doomed int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table+`
WHERE coalesce(seen_at, received_at) < now() - interval '7 days' AND consumer <> $1`, held).Scan(&doomed))
	t.Logf("filled %d expired and %d young inbox rows in %v; %d to delete", expired, young, time.Since(start).Round(time.Millisecond), doomed)
	return doomed
}

// owner returns the consumer of the expired row i of fillInbox.
func owner(i int) string {
	if i%997 == 0 {
		return held
	}
	return fmt.Sprintf("c%d", i%consumers)
}

// forgets returns, per consumer, the horizon a cleanup of the rows of
// fillInbox older than seven days records: the highest offset and the
// newest sighting among them.
func forgets(t *testing.T, pool *pgxpool.Pool, tables idem.Tables) map[string]inbox.Horizon {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT consumer, max(GREATEST(stream_offset, seen_offset)), max(coalesce(seen_at, received_at))
FROM `+tables.Table("inbox")+` WHERE coalesce(seen_at, received_at) < now() - interval '7 days' AND consumer <> $1
GROUP BY consumer`, held)
	require.NoError(t, err)
	hs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (h inbox.Horizon, err error) {
		err = row.Scan(&h.Consumer, &h.Offset, &h.SeenAt)
		return h, err
	})
	require.NoError(t, err)
	out := map[string]inbox.Horizon{}
	for _, h := range hs {
		out[h.Consumer] = h
	}
	require.Len(t, out, consumers)
	return out
}

// doorTimeout bounds each measured door: a statement gone quadratic would
// take hours on a million rows; the test fails with what it measured.
const doorTimeout = 3 * time.Minute

// plans runs test once per plan cache mode, each in a subtest.
func plans(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{testdb.CustomPlans, testdb.GenericPlans} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}

// A clean-up of a million expired rows reads each of them about once, with
// a snapshot held open that keeps every row it deletes in the index: no
// chunk reads again what the chunks before it deleted. The horizons it
// records are then read by key, whatever it deleted.
func TestScaleCleanupReadsEachExpiredRowOnceUnderAnOpenSnapshot(t *testing.T) {
	plans(t, func(t *testing.T, mode string) {
		pool, ib, tables := setup(t)
		ctx := t.Context()
		doomed := fillInbox(t, pool, ib, tables, 1_000_000, 200_000)
		horizons := forgets(t, pool, tables)
		testdb.HoldSnapshot(t)
		plan := testdb.PlanPool(t, mode)
		meter := testdb.NewMeter(t, tables.Schema, plan)

		var res inbox.CleanupResult
		var err error
		work := meter.Measure(func() {
			ctx, cancel := context.WithTimeout(ctx, doorTimeout) // a quadratic cleanup would take hours
			defer cancel()
			res, err = ib.Cleanup(ctx, plan, inbox.CleanupOptions{OlderThan: 7 * day})
		})
		work.RequirePerRow(t, "inbox cleanup", res.Deleted)
		require.NoError(t, err)
		require.Equal(t, doomed, res.Deleted)
		for c, want := range horizons {
			h, ok, err := ib.Horizon(ctx, pool, c, "orders")
			require.NoError(t, err)
			require.True(t, ok, c)
			require.Equal(t, *want.Offset, *h.Offset, "%s: the highest offset of the rows deleted", c)
			require.WithinDuration(t, want.SeenAt, h.SeenAt, 0, "%s: the newest sighting of the rows deleted", c)
		}

		var left, heldLeft int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE consumer = $1) FROM `+
			tables.Table("inbox")+` WHERE received_at < now() - interval '7 days'`, held).Scan(&left, &heldLeft))
		require.EqualValues(t, 1_000_000/997, heldLeft, "the held scope keeps every row")
		require.Equal(t, int64(1_000_000)-doomed, left, "the rows seen again and the held scope's are kept")

		var found int64
		work = meter.Measure(func() {
			for c := range consumers {
				consumer := fmt.Sprintf("c%d", c)
				h, ok, err := ib.Horizon(ctx, plan, consumer, "orders")
				require.NoError(t, err)
				require.True(t, ok)
				require.ErrorIs(t, ib.CheckOffset(ctx, plan, consumer, "orders", *h.Offset), inbox.ErrBeyondHorizon)
				require.ErrorIs(t, ib.CheckSeen(ctx, plan, consumer, h.SeenAt), inbox.ErrBeyondHorizon)
				found += 3
			}
		})
		work.RequirePerRow(t, "horizon lookups after the cleanup", found)
	})
}

// A claim costs the same reads with a million rows of history: a batch of
// new messages, then the same batch again (duplicates, their sightings
// recorded), then lookups of single rows and of a batch of claims.
func TestScaleClaimsReadOnlyTheirKeysAtDepth(t *testing.T) {
	plans(t, func(t *testing.T, mode string) {
		pool, ib, tables := setup(t)
		ctx := t.Context()
		fillInbox(t, pool, ib, tables, 1_000_000, 200_000)
		testdb.HoldSnapshot(t)
		plan := testdb.PlanPool(t, mode)
		meter := testdb.NewMeter(t, tables.Schema, plan)

		const batch = 200
		claims := make([]inbox.Claim, batch)
		for i := range claims {
			id := fmt.Sprintf("new-%d", i)
			claims[i] = inbox.Claim{Consumer: "c1", MessageID: id, PayloadHash: hash(id), Source: "orders"}
		}
		claimAll := func(want inbox.Decision) {
			for range 3 { // past the five executions after which a generic plan may stick
				err := pgx.BeginFunc(ctx, plan, func(tx pgx.Tx) error {
					res, err := ib.ClaimBatch(ctx, tx, claims)
					require.NoError(t, err)
					for _, r := range res {
						require.Equal(t, want, r.Decision)
					}
					return nil
				})
				require.NoError(t, err)
				want = inbox.Duplicate
			}
		}
		work := meter.Measure(func() { claimAll(inbox.NewMessage) })
		work.RequirePerRow(t, "claim batches, new then duplicates", 3*batch)

		// Rows of the history, each read once: a row's own versions (each
		// sighting leaves one while the snapshot is held) are its cost, not
		// the history's.
		past := func(i int) (consumer, id string) { return owner(1000*i + 1), fmt.Sprintf("m-%d", 1000*i+1) }
		work = meter.Measure(func() {
			for i := range batch {
				c, id := past(i)
				_, err := ib.Lookup(ctx, plan, c, id)
				require.NoError(t, err)
				c, id = past(i + batch)
				ok, err := ib.Touch(ctx, plan, c, id)
				require.NoError(t, err)
				require.True(t, ok)
			}
			lookups := make([]inbox.Claim, batch)
			for i := range lookups {
				c, id := past(i + 2*batch)
				lookups[i] = inbox.Claim{Consumer: c, MessageID: id, PayloadHash: hash(id)}
			}
			res, err := ib.LookupClaims(ctx, plan, lookups)
			require.NoError(t, err)
			for _, r := range res {
				require.NotEqual(t, inbox.NewMessage, r.Decision)
			}
		})
		work.RequirePerRow(t, "lookups, touches and lookups of claims", 3*batch)
	})
}

// Deleting a scope of a million rows (an online rebuild's, after its swap)
// reads each of its rows about once, with a snapshot held open, beside a
// scope of the same size that it leaves alone.
func TestScaleDeleteScopeReadsEachRowOnceUnderAnOpenSnapshot(t *testing.T) {
	plans(t, func(t *testing.T, mode string) {
		pool, ib, tables := setup(t)
		ctx := t.Context()
		_, err := pool.Exec(ctx, `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash)
SELECT c, 'm-' || i, sha256(int8send(i)) FROM generate_series(1, 1000000) AS i, unnest(ARRAY['live', 'live@rebuild:r1']) AS c`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `ANALYZE `+tables.Table("inbox"))
		require.NoError(t, err)
		testdb.HoldSnapshot(t)
		plan := testdb.PlanPool(t, mode)

		var n int64
		work := testdb.NewMeter(t, tables.Schema, plan).Measure(func() {
			n, err = ib.DeleteScope(ctx, plan, "live@rebuild:r1")
			require.NoError(t, err)
		})
		require.EqualValues(t, 1_000_000, n)
		work.RequirePerRow(t, "delete a scope", n)
	})
}
