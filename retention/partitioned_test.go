package retention_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/retention"
)

// partitionWidth is narrower than inbox.MinPartitionWidth, so that a
// worker meets several partition starts within seconds.
const partitionWidth = 2 * time.Second

// layOutNarrow lays the inbox of a migrated schema out in partitions of
// partitionWidth: the public door's width (a minute), then the width
// itself, before any partition exists.
func layOutNarrow(t *testing.T, pool *pgxpool.Pool, tables idem.Tables) {
	t.Helper()
	ctx := t.Context()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ib.LayOutPartitioned(ctx, tx, time.Minute); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE "+tables.Table("inbox_layout")+" SET partition_width = make_interval(secs => $1)",
			partitionWidth.Seconds())
		return err
	}))
}

// dbBucket is the partition of the database clock now.
func dbBucket(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var b int64
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT (floor(extract(epoch FROM clock_timestamp()) / $1) * $1)::bigint",
		int64(partitionWidth/time.Second)).Scan(&b))
	return b
}

// A worker runs across several partition starts, with retention.Run beside
// it making the partitions. Every copy of a message claimed in an earlier
// partition is a duplicate, a copy with another payload a conflict; then
// retention drops the partitions whole and records the horizon.
func TestPartitionedInboxWorkerAcrossRotationsThenCleanupDropsPartitions(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	layOutNarrow(t, pool, tables)
	queue, ch := testbroker.Queue(t), testbroker.Channel(t)
	eff := testrun.NewEffects(t, pool, tables)
	c, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "w", Pool: pool, Queue: queue, Tables: tables,
		Logger: testrun.Logger(), RetryBaseDelay: 20 * time.Millisecond, RetryMaxDelay: 100 * time.Millisecond})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return eff.Insert(ctx, tx, m.ID) })
	require.NoError(t, c.Declare(t.Context()))
	stopWorker := testrun.Start(t, c.Run)
	stopRetention := testrun.Start(t, func(ctx context.Context) error {
		return retention.Run(ctx, retention.Config{Pool: pool, Tables: tables, OlderThan: time.Hour, Floor: time.Hour,
			Interval: 500 * time.Millisecond, Jitter: time.Millisecond, Logger: testrun.Logger()})
	})
	publish := func(id, body string) {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", queue, false, false, amqp.Publishing{
			MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent}))
	}
	const rounds, perRound = 4, 20
	var sent int64
	for r := range rounds {
		bucket := dbBucket(t, pool)
		for i := range perRound {
			publish(fmt.Sprintf("m-%d-%d", r, i), fmt.Sprintf(`{"n":%d}`, i))
			sent++
			if r > 0 { // a copy of the message of the round before, claimed in an earlier partition
				publish(fmt.Sprintf("m-%d-%d", r-1, i), fmt.Sprintf(`{"n":%d}`, i))
				sent++
			}
		}
		if r > 0 {
			publish(fmt.Sprintf("m-%d-0", r-1), `{"n":"another payload"}`)
			sent++
		}
		testrun.WaitFor(t, 60*time.Second, "every copy settled", func() bool {
			s := c.Stats()
			return s.Processed+s.Duplicates+s.DeadLettered == sent
		})
		testrun.WaitFor(t, 10*time.Second, "the next partition", func() bool { return dbBucket(t, pool) != bucket })
	}
	stopWorker()
	stopRetention()

	counts := eff.Counts()
	require.Len(t, counts, rounds*perRound)
	for id, n := range counts {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
	s := c.Stats()
	require.Equal(t, int64((rounds-1)*perRound), s.Duplicates, "every copy from an earlier partition is a duplicate")
	var conflicts, parts, inDefault int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+tables.Table("dead_letters")+
		" WHERE reason = 'payload_conflict'").Scan(&conflicts))
	require.Equal(t, rounds-1, conflicts)
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(DISTINCT tableoid) FROM "+tables.Table("inbox")).Scan(&parts))
	require.GreaterOrEqual(t, parts, rounds-1, "the rows lie in several partitions")
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+tables.Table("inbox_default")).Scan(&inDefault))
	require.Zero(t, inDefault, "retention made every partition ahead of the claims")

	// Once every partition ends before the cutoff, a cleanup drops them all.
	end := dbBucket(t, pool) + int64(partitionWidth/time.Second)
	testrun.WaitFor(t, 20*time.Second, "every partition before the cutoff", func() bool { return dbBucket(t, pool) >= end+4 })
	res, err := retention.Clean(t.Context(), retention.Config{Pool: pool, Tables: tables, OlderThan: 4 * time.Second, Floor: time.Second})
	require.NoError(t, err)
	require.Equal(t, int64(rounds*perRound), res.Deleted("inbox"))
	var dropped int
	for _, cnt := range res.Counts {
		if cnt.Table == "inbox" {
			dropped = cnt.Partitions
		}
	}
	require.GreaterOrEqual(t, dropped, rounds)
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	hs, err := ib.Horizons(t.Context(), pool, "w")
	require.NoError(t, err)
	require.NotEmpty(t, hs, "the horizon records what the dropped partitions held")
	require.ErrorIs(t, ib.CheckSeen(t.Context(), pool, "w", hs[0].SeenAt), inbox.ErrBeyondHorizon)
}
