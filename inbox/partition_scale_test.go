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

// Invariant 18 for the partitioned inbox: a claim across partitions, the
// cleanup that drops them, and the online conversion of a plain inbox of a
// million rows each read in proportion to what they return, delete or
// convert, by the server's counters, with a snapshot held open.
//
// The counters of a dropped partition go with it: what cleanup reads in a
// partition it drops (one sequential read, for the horizon) cannot be
// counted after the drop. The tests count every table that is left, so a
// cleanup or a claim that reads partitions it keeps fails them.

// fillPartitioned fills a partitioned inbox one day wide with rows claimed
// from 30 to 8 days ago (expired) and in the last 6 days (young), over
// consumers c0..c7, every 500th expired row seen again a day ago, and the
// expired rows of one day (10 days ago) in a held scope; it makes the
// partition of each day first (one row each, moved out of the default
// partition by EnsurePartitions), so the rows go straight to theirs. It
// returns how many rows the partitions before the cutoff of seven days
// hold, outside the held one.
func fillPartitioned(t *testing.T, pool *pgxpool.Pool, ib *inbox.Inbox, tables idem.Tables, expired, young int) int64 {
	t.Helper()
	ctx := t.Context()
	table := tables.Table("inbox")
	start := time.Now()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash, received_at)
SELECT 'seed', 'seed-' || d, sha256(int8send(d)), now() - d * interval '1 day' FROM generate_series(0, 31) AS d`)
	require.NoError(t, err)
	_, err = ib.EnsurePartitions(ctx, pool, 0)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash, source, stream_offset, received_at, seen_at)
SELECT CASE WHEN r BETWEEN now() - interval '10 days' AND now() - interval '9 days 12 hours' THEN $3 ELSE 'c' || (i % $4) END,
	'm-' || i, sha256(int8send(i)), 'orders', i, r, CASE WHEN i % 500 = 0 THEN now() - interval '1 day' END
FROM (SELECT i, now() - interval '30 days' + (i / 100) * ((interval '22 days') / ($1 / 100 + 1)) AS r
	FROM generate_series(1, $1::bigint) AS i) AS e
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
	require.NoError(t, pool.QueryRow(ctx, `WITH p AS (
	SELECT floor(extract(epoch FROM coalesce(seen_at, received_at)) / 86400) AS b, bool_or(consumer = $1) AS h, count(*) AS n
	FROM `+table+` GROUP BY 1
)
SELECT coalesce(sum(n), 0)::bigint FROM p WHERE (b + 1) * 86400 <= extract(epoch FROM now() - interval '7 days') AND NOT h`, held).Scan(&doomed))
	t.Logf("filled %d expired and %d young rows in daily partitions in %v; %d in partitions to drop", expired, young, time.Since(start).Round(time.Millisecond), doomed)
	return doomed
}

// Claims across 30-odd daily partitions of a million rows read only their
// keys: a probe of each partition's index per key, finding at most one
// entry; and cleanup drops the expired partitions without reading the ones
// it keeps, a snapshot held open.
func TestScalePartitionedClaimsAndCleanupReadPerRowAtDepth(t *testing.T) {
	pool, ib, tables := partitioned(t, 24*time.Hour)
	ctx := t.Context()
	doomed := fillPartitioned(t, pool, ib, tables, 1_000_000, 200_000)
	testdb.HoldSnapshot(t)

	const batch = 200
	for _, mode := range []string{testdb.CustomPlans, testdb.GenericPlans} {
		t.Run(mode, func(t *testing.T) {
			plan := testdb.PlanPool(t, mode)
			meter := testdb.NewMeter(t, tables.Schema, plan)
			claims := make([]inbox.Claim, batch)
			for i := range claims {
				id := fmt.Sprintf("new-%s-%d", mode, i)
				claims[i] = inbox.Claim{Consumer: "c1", MessageID: id, PayloadHash: hash(id), Source: "orders"}
			}
			claimAll := func(claims []inbox.Claim, want ...inbox.Decision) {
				for _, w := range want {
					require.NoError(t, pgx.BeginFunc(ctx, plan, func(tx pgx.Tx) error {
						res, err := ib.ClaimBatch(ctx, tx, claims)
						require.NoError(t, err)
						for _, r := range res {
							require.Equal(t, w, r.Decision)
						}
						return nil
					}))
				}
			}
			work := meter.Measure(func() { claimAll(claims, inbox.NewMessage, inbox.Duplicate, inbox.Duplicate) })
			work.RequirePerRow(t, "partitioned claim batches, new then duplicates", 3*batch)

			// Copies of the history, each row in a partition of its own
			// day: the claim finds it and moves it to the partition of now.
			off := 0
			if mode == testdb.GenericPlans {
				off = 1
			}
			history := make([]inbox.Claim, batch)
			for i := range history {
				n := 4000*i + 2*off + 1
				id := fmt.Sprintf("m-%d", n)
				var h []byte
				require.NoError(t, pool.QueryRow(ctx, "SELECT sha256(int8send($1::bigint))", n).Scan(&h))
				ph, err := idem.HashFromBytes(h)
				require.NoError(t, err)
				history[i] = inbox.Claim{Consumer: fmt.Sprintf("c%d", n%consumers), MessageID: id, PayloadHash: ph, Source: "orders"}
			}
			work = meter.Measure(func() { claimAll(history, inbox.Duplicate) })
			work.RequirePerRow(t, "partitioned claims of copies of the history", batch)
		})
	}

	plan := testdb.PlanPool(t, testdb.GenericPlans)
	meter := testdb.NewMeter(t, tables.Schema, plan)
	var res inbox.CleanupResult
	var err error
	work := meter.Measure(func() {
		ctx, cancel := context.WithTimeout(ctx, doorTimeout)
		defer cancel()
		res, err = ib.Cleanup(ctx, plan, inbox.CleanupOptions{OlderThan: 7 * day})
	})
	require.NoError(t, err)
	t.Logf("cleanup: %+v", res)
	require.Zero(t, res.Chunks, "no row deleted one by one")
	require.Positive(t, res.Partitions)
	require.Positive(t, res.HeldPartitions, "the held scope's partitions are kept")
	// The copies of the history claimed above left their partitions.
	require.InDelta(t, doomed, res.Deleted, float64(2*batch))
	work.RequirePerRow(t, "partitioned cleanup (the tables it keeps)", res.Deleted)
	_, ok, err := ib.Horizon(ctx, pool, "c1", "orders")
	require.NoError(t, err)
	require.True(t, ok)
}

// A plain inbox of 1.2 million rows is converted online while a claimer
// runs: the conversion reads each row about once (the check's
// validation), no claim waits behind it for long, claims then read only
// their keys across the legacy and time partitions, and cleanup deletes
// the legacy partition's expired rows reading each about once, a snapshot
// held open.
func TestScaleConvertingAMillionRowInboxReadsEachRowOnce(t *testing.T) {
	pool, ib, tables := setup(t)
	ctx := t.Context()
	doomed := fillInbox(t, pool, ib, tables, 1_000_000, 200_000)
	testdb.HoldSnapshot(t)
	plan := testdb.PlanPool(t, testdb.GenericPlans)
	meter := testdb.NewMeter(t, tables.Schema, plan)

	probe, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	probePool := testdb.PlanPool(t, "")
	prober := probeClaims(ctx, t, probePool, 10*time.Millisecond, "c1", "orders", func(ctx context.Context, tx pgx.Tx, c inbox.Claim) error {
		_, err := probe.ClaimBatch(ctx, tx, []inbox.Claim{c})
		return err
	})
	var rows int64
	var oid uint32
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), to_regclass($1)::oid FROM "+tables.Table("inbox"), tables.Table("inbox")).Scan(&rows, &oid))
	// The table changes its name on the way (the Meter counts by name):
	// its own reads are counted by its oid.
	relReads := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT t.seq_tup_read + coalesce(t.idx_tup_fetch, 0) +
	coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes AS i WHERE i.relid = t.relid), 0)::bigint
FROM pg_stat_user_tables AS t WHERE t.relid = $1`, oid).Scan(&n))
		return n
	}
	start := time.Now()
	var before int64
	work := meter.Measure(func() {
		before = relReads()
		require.NoError(t, ib.ConvertPartitioned(ctx, plan, time.Hour))
	})
	took := time.Since(start)
	probes, worst := prober.end()
	read := relReads() - before
	t.Logf("converted %d rows in %v, reading %d rows and index entries of the old table (%.2f per row); the slowest of %d claims meanwhile took %v",
		rows, took.Round(time.Millisecond), read, float64(read)/float64(rows), probes, worst.Round(time.Millisecond))
	require.LessOrEqual(t, read, rows*3/2, "the validation of the check reads each row of the old table once, the attach none")
	delete(work, tables.WithDefaults().Prefix+"inbox_legacy") // counted by name: the table's whole history; counted by oid above
	work.RequirePerRow(t, "online conversion", rows)
	require.Less(t, worst, 4*time.Second, "a claim waited behind the conversion")

	const batch = 200
	claims := make([]inbox.Claim, batch)
	for i := range claims {
		n := 1000*i + 1
		id := fmt.Sprintf("m-%d", n)
		var h []byte
		require.NoError(t, pool.QueryRow(ctx, "SELECT sha256(int8send($1::bigint))", n).Scan(&h))
		ph, err := idem.HashFromBytes(h)
		require.NoError(t, err)
		claims[i] = inbox.Claim{Consumer: owner(n), MessageID: id, PayloadHash: ph, Source: "orders"}
	}
	work = meter.Measure(func() {
		require.NoError(t, pgx.BeginFunc(ctx, plan, func(tx pgx.Tx) error {
			res, err := ib.ClaimBatch(ctx, tx, claims)
			require.NoError(t, err)
			for _, r := range res {
				require.Equal(t, inbox.Duplicate, r.Decision)
			}
			return nil
		}))
	})
	work.RequirePerRow(t, "claims of the history in the legacy partition", batch)

	var res inbox.CleanupResult
	work = meter.Measure(func() {
		ctx, cancel := context.WithTimeout(ctx, doorTimeout)
		defer cancel()
		res, err = ib.Cleanup(ctx, plan, inbox.CleanupOptions{OlderThan: 7 * day})
	})
	require.NoError(t, err)
	require.InDelta(t, doomed, res.Deleted, float64(batch), "the expired rows of the legacy partition, but the copies just claimed")
	work.RequirePerRow(t, "cleanup of the legacy partition", res.Deleted)
}
