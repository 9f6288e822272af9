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

// partitioned returns an inbox laid out in partitions width wide, with
// its first partitions made. A width below a minute is for tests only.
func partitioned(t *testing.T, width time.Duration) (*pgxpool.Pool, *inbox.Inbox, idem.Tables) {
	t.Helper()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if width < inbox.MinPartitionWidth {
			return inbox.LayOutNarrow(ctx, ib, tx, width)
		}
		return ib.LayOutPartitioned(ctx, tx, width)
	}))
	_, err := ib.EnsurePartitions(ctx, pool, 0)
	require.NoError(t, err)
	return pool, ib, tables
}

// partitionOf returns the partition that holds the one row of id.
func partitionOf(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, consumer, id string) string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT tableoid::regclass::text FROM "+tables.Table("inbox")+
		" WHERE consumer = $1 AND message_id = $2", consumer, id)
	require.NoError(t, err)
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, parts, 1, "one row for %q", id)
	return parts[0]
}

// bucket is the start of the partition of the database's now() in q's
// transaction (or statement).
func bucket(t *testing.T, q inbox.Querier, width time.Duration) int64 {
	t.Helper()
	var b int64
	require.NoError(t, q.QueryRow(t.Context(), "SELECT (floor(extract(epoch FROM now()) / $1) * $1)::bigint",
		int64(width/time.Second)).Scan(&b))
	return b
}

// awaitNextPartition waits until the database clock is in the partition
// after the one it is in now.
func awaitNextPartition(t *testing.T, pool *pgxpool.Pool, width time.Duration) {
	t.Helper()
	start := bucket(t, pool, width)
	deadline := time.Now().Add(3 * width)
	for bucket(t, pool, width) == start {
		require.True(t, time.Now().Before(deadline), "the database clock did not reach the next partition")
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPartitionedRedeliveryInALaterPartitionIsADuplicateOrAConflict(t *testing.T) {
	t.Parallel()
	const width = 2 * time.Second
	pool, ib, tables := partitioned(t, width)
	ctx := t.Context()
	c := inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: hash("a"), Source: "s", StreamOffset: at(1)}
	require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, c).Decision)
	first := partitionOf(t, pool, tables, "c", "m")

	awaitNextPartition(t, pool, width)
	c.StreamOffset = at(2)
	require.Equal(t, inbox.Result{Decision: inbox.Duplicate, StoredHash: hash("a")}, claimCommitted(t, pool, ib, c))
	second := partitionOf(t, pool, tables, "c", "m")
	require.NotEqual(t, first, second, "the sighting moved the row into the partition of its time")

	awaitNextPartition(t, pool, width)
	other := c
	other.PayloadHash = hash("b")
	require.Equal(t, inbox.Result{Decision: inbox.Conflict, StoredHash: hash("a")}, claimCommitted(t, pool, ib, other))

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.ClaimNewBatch(ctx, tx, []inbox.Claim{{Consumer: "c", MessageID: "n", PayloadHash: hash("n")}, c})
		return err
	})
	require.ErrorIs(t, err, inbox.ErrClaimed)
	var got []inbox.Result
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		got, err = ib.ClaimBatch(ctx, tx, []inbox.Claim{c, {Consumer: "c", MessageID: "n", PayloadHash: hash("n")}, c})
		return err
	}))
	require.Equal(t, []inbox.Decision{inbox.Duplicate, inbox.NewMessage, inbox.Duplicate},
		[]inbox.Decision{got[0].Decision, got[1].Decision, got[2].Decision})
	rec, err := ib.Lookup(ctx, pool, "c", "m")
	require.NoError(t, err)
	require.Equal(t, int64(2), *rec.SeenOffset)
}

// Two copies of one message claimed at once by two transactions, one begun
// before a partition starts and one after it: each would insert into its
// own partition, and no index spans both. The second waits for the first
// and decides against its row, in either order.
func TestPartitionedCopiesClaimedAtOnceAcrossAPartitionStartAreOneMessage(t *testing.T) {
	t.Parallel()
	const width = 2 * time.Second
	pool, ib, tables := partitioned(t, width)
	for i, tc := range []struct {
		name                string
		olderFirst, commits bool
		secondHash          string
		want                inbox.Decision
	}{
		{"older commits, newer duplicate", true, true, "a", inbox.Duplicate},
		{"newer commits, older duplicate", false, true, "a", inbox.Duplicate},
		{"older commits, newer conflict", true, true, "b", inbox.Conflict},
		{"newer rolls back, older new", false, false, "a", inbox.NewMessage},
	} {
		id := fmt.Sprintf("m-%d", i)
		older, err := pool.Begin(t.Context())
		require.NoError(t, err)
		awaitNextPartition(t, pool, width)
		newer, err := pool.Begin(t.Context())
		require.NoError(t, err)
		require.NotEqual(t, bucket(t, older, width), bucket(t, newer, width), tc.name)
		first, second := older, newer
		if !tc.olderFirst {
			first, second = newer, older
		}
		res, err := ib.Claim(t.Context(), first, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash("a")})
		require.NoError(t, err)
		require.Equal(t, inbox.NewMessage, res.Decision, tc.name)

		done := make(chan inbox.Result, 1)
		go func() {
			res, err := ib.Claim(context.Background(), second, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(tc.secondHash)})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		awaitLockWait(t, pool, second)
		if tc.commits {
			require.NoError(t, first.Commit(t.Context()))
		} else {
			require.NoError(t, first.Rollback(t.Context()))
		}
		select {
		case res = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the second claim did not return", tc.name)
		}
		require.Equal(t, tc.want, res.Decision, tc.name)
		require.NoError(t, second.Commit(t.Context()))
		partitionOf(t, pool, tables, "c", id) // exactly one row
	}
}

// awaitLockWait waits until tx's connection waits for a lock.
func awaitLockWait(t *testing.T, pool *pgxpool.Pool, tx pgx.Tx) {
	t.Helper()
	pid := tx.Conn().PgConn().PID()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, pool.QueryRow(t.Context(),
			"SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid).Scan(&waiting))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "the second claim never waited for the first")
		time.Sleep(10 * time.Millisecond)
	}
}

// Without any partition but the default one, claims go on; making the
// partitions later moves their rows, and a copy is still a duplicate.
func TestPartitionedClaimNeverFailsForWantOfAPartition(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ib.LayOutPartitioned(ctx, tx, time.Minute) }))
	c := inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: hash("a")}
	require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, c).Decision)
	require.Contains(t, partitionOf(t, pool, tables, "c", "m"), "inbox_default")

	made, err := ib.EnsurePartitions(ctx, pool, 2)
	require.NoError(t, err)
	require.Equal(t, 3, made)
	require.NotContains(t, partitionOf(t, pool, tables, "c", "m"), "inbox_default", "moved out of the default partition")
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, c).Decision)
	made, err = ib.EnsurePartitions(ctx, pool, 2)
	require.NoError(t, err)
	require.Zero(t, made, "nothing to make twice")
}

func TestPartitionedCleanupDropsWholePartitionsAndRecordsTheirHorizon(t *testing.T) {
	t.Parallel()
	pool, ib, tables := partitioned(t, time.Minute)
	ctx := t.Context()
	for i := range int64(10) {
		id := fmt.Sprintf("m-%d", i)
		claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id), Source: "s", StreamOffset: at(i)})
	}
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c@rebuild:1", MessageID: "h", PayloadHash: hash("h"), Source: "s", StreamOffset: at(3)})
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "young", PayloadHash: hash("y"), Source: "s", StreamOffset: at(10)})
	// Two hours ago for the ten, three for the held scope's row: into the
	// default partition, which has no partition of those times.
	_, err := pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+` SET received_at = now() - interval '2 hours' WHERE message_id LIKE 'm-%'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+` SET received_at = now() - interval '3 hours' WHERE message_id = 'h'`)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ib.Hold(ctx, tx, "c@rebuild:1", "rebuild 1") }))
	// A copy of m-9 comes again: its row counts from now and stays.
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib,
		inbox.Claim{Consumer: "c", MessageID: "m-9", PayloadHash: hash("m-9"), Source: "s", StreamOffset: at(11)}).Decision)

	opts := inbox.CleanupOptions{OlderThan: time.Hour, Floor: time.Hour}
	res, err := ib.Cleanup(ctx, pool, opts)
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 9, Partitions: 1, HeldPartitions: 1}, res)

	h, ok, err := ib.Horizon(ctx, pool, "c", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(8), *h.Offset, "the highest offset of the dropped partition")
	require.WithinDuration(t, time.Now().Add(-2*time.Hour), h.SeenAt, 5*time.Minute)
	require.ErrorIs(t, ib.CheckOffset(ctx, pool, "c", "s", 8), inbox.ErrBeyondHorizon)
	require.NoError(t, ib.CheckOffset(ctx, pool, "c", "s", 9))
	require.ErrorIs(t, ib.CheckSeen(ctx, pool, "c", time.Now().Add(-2*time.Hour-time.Minute)), inbox.ErrBeyondHorizon)

	for _, id := range []string{"m-9", "young"} {
		_, err := ib.Lookup(ctx, pool, "c", id)
		require.NoError(t, err, id)
	}
	_, err = ib.Lookup(ctx, pool, "c", "m-0")
	require.ErrorIs(t, err, inbox.ErrNotFound)
	_, err = ib.Lookup(ctx, pool, "c@rebuild:1", "h")
	require.NoError(t, err, "a held scope's partition is kept")

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ib.Release(ctx, tx, "c@rebuild:1") }))
	res, err = ib.Cleanup(ctx, pool, opts)
	require.NoError(t, err)
	require.Equal(t, inbox.CleanupResult{Deleted: 1, Partitions: 1}, res)
	h, ok, err = ib.Horizon(ctx, pool, "c@rebuild:1", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), *h.Offset)

	_, err = ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Hour, Floor: time.Hour, Consumer: "c"})
	require.ErrorIs(t, err, inbox.ErrPartitioned)
}

// Touch and DeleteScope work on the partitioned layout: Touch moves the row
// into the partition of now, DeleteScope deletes one scope's rows only.
func TestPartitionedTouchAndDeleteScope(t *testing.T) {
	t.Parallel()
	pool, ib, tables := partitioned(t, time.Minute)
	ctx := t.Context()
	for _, c := range []string{"a", "b"} {
		for i := range 3 {
			id := fmt.Sprintf("m-%d", i)
			claimCommitted(t, pool, ib, inbox.Claim{Consumer: c, MessageID: id, PayloadHash: hash(id)})
		}
	}
	_, err := pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+` SET received_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = ib.EnsurePartitions(ctx, pool, 0)
	require.NoError(t, err)
	old := partitionOf(t, pool, tables, "a", "m-0")
	ok, err := ib.Touch(ctx, pool, "a", "m-0")
	require.NoError(t, err)
	require.True(t, ok)
	require.NotEqual(t, old, partitionOf(t, pool, tables, "a", "m-0"))

	n, err := ib.DeleteScope(ctx, pool, "b")
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("inbox")+" WHERE consumer = 'a'").Scan(&left))
	require.Equal(t, 3, left)
}

// Rows claimed while no partition covered their time sit in the default
// partition; making their partition moves them while copies of them are
// claimed. Every copy still finds its row: a duplicate, never new.
func TestPartitionedCopiesClaimedWhileTheirRowsMoveOutOfTheDefaultPartition(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return inbox.LayOutNarrow(ctx, ib, tx, 2*time.Second) }))
	const n = 40
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id)})
	}
	var inDefault int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("inbox_default")).Scan(&inDefault))
	require.Equal(t, n, inDefault)

	made := make(chan error, 1)
	go func() {
		_, err := ib.EnsurePartitions(context.Background(), pool, 0)
		made <- err
	}()
	decisions := make(chan inbox.Decision, n)
	for i := range n {
		go func() {
			var res inbox.Result
			id := fmt.Sprintf("m-%d", i)
			err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				var err error
				res, err = ib.Claim(context.Background(), tx, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id)})
				return err
			})
			if err != nil {
				t.Error(err)
			}
			decisions <- res.Decision
		}()
	}
	for range n {
		require.Equal(t, inbox.Duplicate, <-decisions)
	}
	require.NoError(t, <-made)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("inbox")).Scan(&rows))
	require.Equal(t, n, rows, "one row per message")
}

// A transaction that claims an id twice decides the second claim against
// its own row, and Unclaim takes that row back, as in the plain layout;
// the claims work in every query exec mode.
func TestPartitionedClaimTwiceInOneTransactionAndUnclaim(t *testing.T) {
	t.Parallel()
	base, ib, _ := partitioned(t, time.Minute)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		pool := testdb.WithExecMode(t, base, mode)
		ctx := t.Context()
		id := "m-" + mode.String()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			c := inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash("a"), Source: "s", StreamOffset: at(1)}
			res, err := ib.Claim(ctx, tx, c)
			require.NoError(t, err)
			require.Equal(t, inbox.NewMessage, res.Decision)
			c.PayloadHash = hash("b")
			got, err := ib.ClaimBatch(ctx, tx, []inbox.Claim{c})
			require.NoError(t, err)
			require.Equal(t, inbox.Result{Decision: inbox.Conflict, StoredHash: hash("a")}, got[0])
			require.NoError(t, ib.Unclaim(ctx, tx, "c", id))
			return nil
		}), mode.String())
		_, err := ib.Lookup(ctx, pool, "c", id)
		require.ErrorIs(t, err, inbox.ErrNotFound, mode.String())
		require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash("a")}).Decision)
		require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash("a")}).Decision)
	}
}
