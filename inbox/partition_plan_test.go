package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// claimRound claims, in one transaction on conn, a duplicate of seen and n
// new ids named after round, and checks the decisions.
func claimRound(t *testing.T, conn *pgxpool.Conn, ib *inbox.Inbox, seen inbox.Claim, round, n int) {
	t.Helper()
	claims := []inbox.Claim{seen}
	for i := range n {
		id := fmt.Sprintf("r%d-%d", round, i)
		claims = append(claims, inbox.Claim{Consumer: seen.Consumer, MessageID: id, PayloadHash: hash(id)})
	}
	require.NoError(t, pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
		res, err := ib.ClaimBatch(t.Context(), tx, claims)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, res[0].Decision, "round %d", round)
		for _, r := range res[1:] {
			require.Equal(t, inbox.NewMessage, r.Decision, "round %d", round)
		}
		return nil
	}))
}

// The partitioned claim is planned once per connection, not at each
// batch: its prepared statement runs on a generic plan every time.
func TestPartitionedClaimIsPlannedOncePerConnection(t *testing.T) {
	t.Parallel()
	pool, ib, tables := partitioned(t, time.Minute)
	ctx := t.Context()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 140000 {
		t.Skip("pg_prepared_statements counts plans from PostgreSQL 14 on")
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	seen := inbox.Claim{Consumer: "c", MessageID: "seen", PayloadHash: hash("seen")}
	claimCommitted(t, pool, ib, seen)
	const rounds = 8
	for round := range rounds {
		claimRound(t, conn, ib, seen, round, 3)
	}
	var generic, custom int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0)::bigint, coalesce(sum(custom_plans), 0)::bigint
FROM pg_prepared_statements WHERE statement LIKE '%found AS%' AND strpos(statement, $1) > 0`, tables.Table("inbox")).Scan(&generic, &custom))
	require.Zero(t, custom, "no batch planned for its own parameters")
	require.EqualValues(t, rounds, generic, "every batch ran the generic plan")
}

// The partitioned claim reads only its keys' rows on a connection whose
// plan was made while the partition of now was small, after that partition
// has grown without fresh statistics: the plan is index probes whatever
// the statistics said when it was made.
func TestPartitionedClaimReadsOnlyItsKeysAfterAPartitionGrew(t *testing.T) {
	t.Parallel()
	pool, ib, tables := partitioned(t, time.Hour)
	ctx := t.Context()
	table := tables.Table("inbox")
	parts, err := pool.Query(ctx, `SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) WHERE isleaf`, table)
	require.NoError(t, err)
	leaves, err := pgx.CollectRows(parts, pgx.RowTo[string])
	require.NoError(t, err)
	for _, l := range leaves {
		_, err := pool.Exec(ctx, `ALTER TABLE `+l+` SET (autovacuum_enabled = false)`)
		require.NoError(t, err)
	}
	grow := func(from, to int) {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash)
SELECT 'other', 'seed-' || i, sha256(int8send(i)) FROM generate_series($1::bigint, $2::bigint) AS i`, from, to)
		require.NoError(t, err)
	}
	// A young partition of now: a few rows, analyzed.
	grow(1, 50)
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	seen := inbox.Claim{Consumer: "c", MessageID: "seen", PayloadHash: hash("seen")}
	claimCommitted(t, pool, ib, seen)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for round := range 2 {
		claimRound(t, conn, ib, seen, round, 3)
	}
	grow(51, 30000)
	read := func() (n int64) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
FROM pg_stat_xact_user_tables WHERE relid IN (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf)`, table).Scan(&n))
		return n
	}
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		before := read()
		claims := []inbox.Claim{seen}
		for i := range 3 {
			id := fmt.Sprintf("late-%d", i)
			claims = append(claims, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id)})
		}
		res, err := ib.ClaimBatch(ctx, tx, claims)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, res[0].Decision)
		require.LessOrEqual(t, read()-before, int64(10), "rows read by a claim of 4 keys among 30,000 rows")
		return nil
	}))
}

// The claim sets the planner settings it is planned with only around
// itself: the transaction's own settings are as they were after it.
func TestPartitionedClaimLeavesThePlannerSettingsAsTheyWere(t *testing.T) {
	t.Parallel()
	pool, ib, _ := partitioned(t, time.Minute)
	ctx := t.Context()
	const settings = `SELECT concat_ws(',', current_setting('plan_cache_mode'), current_setting('enable_seqscan'),
	current_setting('enable_bitmapscan'), current_setting('enable_hashjoin'), current_setting('enable_mergejoin'),
	current_setting('enable_material'), current_setting('jit'))`
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SET LOCAL enable_hashjoin = off")
		require.NoError(t, err)
		var before, after string
		require.NoError(t, tx.QueryRow(ctx, settings).Scan(&before))
		_, err = ib.ClaimBatch(ctx, tx, []inbox.Claim{{Consumer: "c", MessageID: "m", PayloadHash: hash("m")}})
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, settings).Scan(&after))
		require.Equal(t, before, after)
		return nil
	}))
	var mode string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_hashjoin')").Scan(&mode))
	require.Equal(t, "on", mode, "SET LOCAL ends with its transaction")
}

// A row whose last sighting lies partitions ahead of now (written before
// the server's clock stepped back) is found: the claim looks in every
// partition, those ahead of now too.
func TestPartitionedClaimFindsARowSightedAheadOfNow(t *testing.T) {
	t.Parallel()
	pool, ib, tables := partitioned(t, time.Minute)
	ctx := t.Context()
	stored := hash("ahead")
	_, err := pool.Exec(ctx, `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash, received_at)
VALUES ('c', 'ahead', $1, now() + interval '3 minutes')`, stored[:])
	require.NoError(t, err)
	res := claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "ahead", PayloadHash: hash("other")})
	require.Equal(t, inbox.Conflict, res.Decision)
	require.Equal(t, hash("ahead"), res.StoredHash)
}

// The partitioned claims work in every pgx query exec mode, the exec and
// simple-protocol modes (PgBouncer's) included.
func TestPartitionedClaimsWorkInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	pool, ib, _ := partitioned(t, time.Minute)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			p := testdb.WithExecMode(t, pool, mode)
			consumer := "c-" + mode.String()
			require.NoError(t, pgx.BeginFunc(t.Context(), p, func(tx pgx.Tx) error {
				res, err := ib.ClaimNewBatch(t.Context(), tx, []inbox.Claim{
					{Consumer: consumer, MessageID: "m-1", PayloadHash: hash("a"), BusinessKey: "order-ü"},
					{Consumer: consumer, MessageID: "m-2", PayloadHash: hash("b")},
				})
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
		})
	}
}
