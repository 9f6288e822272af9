//go:build cluster

package testcluster_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

func TestNodesFormOneCluster(t *testing.T) {
	c := testcluster.Require(t)
	require.Len(t, c.Nodes, 3)
	want := slices.Sorted(slices.Values(c.Nodes))
	for _, node := range c.Nodes {
		require.Equal(t, want, c.Running(t, node), "running nodes as %s sees them", node)
	}
}

// A node frozen until the others declared it down, and a net tick (10 s on
// this cluster) more, comes back to a cluster partitioned around it: the
// partition heals by itself, with cluster_partition_handling = autoheal,
// without an operator. It may take minutes: RabbitMQ 3.10 can restart the
// losing node once a minute until every view agrees (docs/operations.md
// has the figures).
func TestAFreezeLongerThanTheNetTickHealsByItself(t *testing.T) {
	c := testcluster.Require(t)
	node, other := c.Nodes[0], c.Nodes[1]
	c.Freeze(t, node)
	frozen := time.Now()
	testrun.WaitFor(t, 2*time.Minute, "the other nodes to declare "+node+" down", func() bool {
		return !slices.Contains(c.Running(t, other), node)
	})
	t.Logf("%s declared down %s after the freeze", node, time.Since(frozen).Round(time.Second))
	time.Sleep(10 * time.Second) // a net tick more
	c.Thaw(t, node)
	thawed := time.Now()
	var split string // the first disagreement seen
	testrun.WaitFor(t, 8*time.Minute, "one cluster again, by itself", func() bool {
		whole, why := c.Whole()
		if split == "" {
			split = why
		}
		return whole
	})
	t.Logf("one cluster again %s after the thaw of %s (first seen: %s)", time.Since(thawed).Round(time.Second), node, split)
}

func TestQuorumQueueHasAMemberOnEveryNode(t *testing.T) {
	c := testcluster.Require(t)
	name := quorumQueue(t, c)
	q := c.QuorumQueue(t, name)
	want := slices.Sorted(slices.Values(c.Nodes))
	require.Equal(t, want, q.Members)
	require.Equal(t, want, q.Online)
	require.Contains(t, c.Nodes, q.Leader)
}

func TestNodeOfNamesTheNodeAConnectionIsAttachedTo(t *testing.T) {
	c := testcluster.Require(t)
	for i, node := range c.Nodes {
		require.Equal(t, node, c.NodeOf(t, dial(t, c.AMQPURLs[i])))
	}
}

// Killing the leader of a quorum queue leaves two of three members: a new
// leader is elected, and a client of another node publishes and consumes
// as before, messages published before the kill included. The killed node
// comes back and its member catches up.
func TestKillingALeaderLeavesAMajorityThatServes(t *testing.T) {
	c := testcluster.Require(t)
	name := quorumQueue(t, c)
	leader := c.QuorumQueue(t, name).Leader
	require.NotEmpty(t, leader)
	other := c.Nodes[(slices.Index(c.Nodes, leader)+1)%len(c.Nodes)]

	ch := channel(t, dial(t, c.URL(t, other)))
	publish(t, ch, name, "before")
	c.Kill(t, leader)

	testrun.WaitFor(t, time.Minute, "a new leader among the two members left", func() bool {
		q := c.QuorumQueue(t, name)
		return q.Leader != "" && q.Leader != leader && len(q.Online) == 2
	})
	require.Len(t, c.Running(t, other), 2)
	publish(t, ch, name, "after")
	require.Equal(t, []string{"before", "after"}, consume(t, ch, name, 2))

	c.Start(t, leader)
	testrun.WaitFor(t, time.Minute, "the restarted node running and its member online", func() bool {
		return len(c.Running(t, other)) == 3 && len(c.QuorumQueue(t, name).Online) == 3
	})
}

func TestStandbyReplicatesThePrimary(t *testing.T) {
	c := testcluster.Require(t)
	table := pgTable(t, c)
	exec(t, c.PGURL, "INSERT INTO "+table+" VALUES (1)")
	testrun.WaitFor(t, 30*time.Second, "the row on the standby", func() bool { return count(c.PGStandby(t), table) == 1 })
}

// After an immediate stop of the primary and the standby's promotion, the
// multi-host URL with target_session_attrs=read-write reaches the promoted
// node, which has the replicated row and takes writes.
func TestMultiHostURLReachesThePromotedStandby(t *testing.T) {
	c := testcluster.Require(t)
	table := pgTable(t, c)
	exec(t, c.PGURL, "INSERT INTO "+table+" VALUES (1)")
	standby := c.PGStandby(t)
	testrun.WaitFor(t, 30*time.Second, "the row on the standby", func() bool { return count(standby, table) == 1 })

	c.StopPGPrimary(t)
	c.PromotePGStandby(t)

	exec(t, c.PGURL, "INSERT INTO "+table+" VALUES (2)")
	require.Equal(t, 2, count(c.PGURL, table))
	require.Equal(t, port(t, standby), serverPort(t, c.PGURL), "PGURL reaches the promoted standby")

	c.RestorePG(t)
	testrun.WaitFor(t, 30*time.Second, "the old primary, a standby again, with both rows", func() bool {
		return count(c.PGStandby(t), table) == 2
	})
}

// With synchronous replication (remote_apply), a commit returns once the
// standby applied it: every row is on the standby as soon as it committed.
func TestSynchronousReplicationAppliesOnTheStandbyBeforeCommitReturns(t *testing.T) {
	c := testcluster.Require(t)
	table := pgTable(t, c)
	c.SetPGSync(t, true)
	standby := connect(t, c.PGStandby(t))
	primary := connect(t, c.PGURL)
	ctx := context.Background()
	for i := range 50 {
		_, err := primary.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", i)
		require.NoError(t, err)
		var n int
		require.NoError(t, standby.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		require.Equal(t, i+1, n)
	}
}

func dial(t *testing.T, u string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func channel(t *testing.T, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	return ch
}

// quorumQueue declares a quorum queue through the first node, deleted when the test ends
// through whichever node answers.
func quorumQueue(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	urls := c.AMQPURLs
	name := testdb.Name(t, "q")
	ch := channel(t, dial(t, urls[0]))
	_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	t.Cleanup(func() { c.DeleteQueues(t, name) })
	return name
}

func publish(t *testing.T, ch *amqp.Channel, queue, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	require.NoError(t, err)
	acked, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, acked, "publish of %q confirmed", body)
}

func consume(t *testing.T, ch *amqp.Channel, queue string, n int) []string {
	t.Helper()
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	var bodies []string
	timeout := time.After(30 * time.Second)
	for len(bodies) < n {
		select {
		case d, ok := <-deliveries:
			require.True(t, ok, "the channel closed")
			require.NoError(t, d.Ack(false))
			bodies = append(bodies, string(d.Body))
		case <-timeout:
			t.Fatalf("consumed %v, want %d messages", bodies, n)
		}
	}
	return bodies
}

// pgTable creates a table on the primary, dropped when the test ends.
func pgTable(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	table := testdb.Name(t, "t")
	exec(t, c.PGURL, "CREATE TABLE "+table+" (n int)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.PGURL)
		if err == nil {
			_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			_ = conn.Close(ctx)
		}
	})
	return table
}

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, u, sql string) {
	t.Helper()
	_, err := connect(t, u).Exec(context.Background(), sql)
	require.NoError(t, err)
}

// count returns the rows of table on the node(s) of u, -1 when it cannot
// tell (the table not replicated yet, the node down).
func count(u, table string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		return -1
	}
	return n
}

func serverPort(t *testing.T, u string) string {
	t.Helper()
	var p int
	require.NoError(t, connect(t, u).QueryRow(context.Background(), "SELECT inet_server_port()").Scan(&p))
	return fmt.Sprint(p)
}

func port(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	return p.Port()
}
