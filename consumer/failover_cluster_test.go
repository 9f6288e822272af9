//go:build cluster

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/migrate"
)

// The faults of a failover run. Each is injected while messages flow at
// failoverRate per second into a worker given every node of the cluster
// and the PostgreSQL pair's multi-host URL.
const (
	// faultWorkerNode kills -9 the node the worker is connected to; it is
	// started again only after the run, so the worker must go on through
	// another node.
	faultWorkerNode = "worker-node"
	// faultLeader kills -9 the leader of the worker's quorum queue, a node
	// the worker is not connected to.
	faultLeader = "leader"
	// faultUnusedNode kills -9 the node that is neither the worker's nor the
	// queue's leader.
	faultUnusedNode = "unused-node"
	// faultPGFailover stops the PostgreSQL primary at once and promotes its
	// synchronous standby (remote_apply).
	faultPGFailover = "pg-failover"
)

// failoverRate is the load of a failover run in messages per second, and
// failoverBefore and failoverAfter how long it flows before the fault and
// after it.
const (
	failoverRate   = 500
	failoverBefore = 3 * time.Second
	failoverAfter  = 6 * time.Second
)

// A worker whose node is killed consumes again through another node of its
// list, without that node coming back, and applies every message once.
func TestAWorkerWhoseNodeIsKilledConsumesThroughAnother(t *testing.T) {
	r := runFailover(t, faultWorkerNode)
	r.requireOnce(t)
	require.NotEmpty(t, r.nodeAfter)
	require.NotEqual(t, r.victim, r.nodeAfter, "the worker consumes through another node")
	// A liveness bound, not a figure: the killed node stays down for the
	// whole run, and BENCHMARKS.md gives the measured time.
	require.Less(t, r.outage, failoverAfter/2, "consuming again within the run, through another node")
}

// Killing the queue's leader, or a node the worker does not use, leaves a
// majority that serves: the worker keeps its connection and applies every
// message once.
func TestKillingTheLeaderOrAnUnusedNodeKeepsTheWorkersConnection(t *testing.T) {
	for _, fault := range []string{faultLeader, faultUnusedNode} {
		t.Run(fault, func(t *testing.T) {
			r := runFailover(t, fault)
			r.requireOnce(t)
			require.Equal(t, r.nodeBefore, r.nodeAfter)
			require.Equal(t, r.connBefore, r.connAfter, "the worker's connection outlives the fault")
		})
	}
}

// An immediate stop of the PostgreSQL primary and the promotion of its
// synchronous standby, reached through the multi-host URL with
// target_session_attrs=read-write: the worker commits on the promoted node
// and loses nothing it acknowledged.
func TestAPrimaryStoppedAndItsSynchronousStandbyPromotedLosesNothing(t *testing.T) {
	r := runFailover(t, faultPGFailover)
	r.requireOnce(t)
	require.Positive(t, r.appliedAfterFault, "messages applied on the promoted node")
}

// BenchmarkFailover measures each fault once per iteration: outage-s is the
// longest time without a message applied from the fault on, baseline-gap-s
// the longest such gap in the stretch before the fault, same run; for the
// PostgreSQL failover, promotion-s is how long scripts/cluster.sh took to
// stop the primary and promote the standby, which the outage includes.
//
//	IDEM_CLUSTER=1 go test -tags cluster -run '^$' -bench Failover -benchtime 1x ./consumer/
func BenchmarkFailover(b *testing.B) {
	for _, fault := range []string{faultWorkerNode, faultLeader, faultUnusedNode, faultPGFailover} {
		b.Run(fault, func(b *testing.B) {
			for range b.N {
				r := runFailover(b, fault)
				r.requireOnce(b)
				b.ReportMetric(r.outage.Seconds(), "outage-s")
				b.ReportMetric(r.baselineGap.Seconds(), "baseline-gap-s")
				if fault == faultPGFailover {
					b.ReportMetric(r.promotion.Seconds(), "promotion-s")
				}
				b.ReportMetric(float64(r.published), "messages")
			}
		})
	}
}

// failoverResult is what one run observed.
type failoverResult struct {
	victim                string // the node killed, empty for PostgreSQL
	nodeBefore, nodeAfter string // the worker's node before the fault and at the end
	connBefore, connAfter string // the worker's connection names, likewise
	published             int    // distinct messages published and confirmed
	counts                map[string]int
	outage, baselineGap   time.Duration
	promotion             time.Duration // the PostgreSQL stop and promotion, by the script
	appliedAfterFault     int           // after the kill, or after the promotion ended
	appliedInWindow       int           // from the fault to the end of its window (see window)
	publishErrors         int
}

// requireOnce fails unless every published message was applied exactly
// once.
func (r failoverResult) requireOnce(tb testing.TB) {
	tb.Helper()
	var lost, twice []string
	for i := range r.published {
		switch id := failoverID(i); r.counts[id] {
		case 0:
			lost = append(lost, id)
		case 1:
		default:
			twice = append(twice, id)
		}
	}
	require.Empty(tb, lost, "messages never applied")
	require.Empty(tb, twice, "messages applied more than once")
	require.Equal(tb, r.published, len(r.counts), "no effect of a message that was not published")
}

func failoverID(i int) string { return fmt.Sprintf("f-%06d", i) }

// runFailover starts a worker on the cluster, lets failoverRate messages per
// second flow into it, injects fault after failoverBefore, goes on for
// failoverAfter, waits until every published message settled and reports.
// Every node runs again and the PostgreSQL pair is whole when it returns or
// when the test ends.
func runFailover(tb testing.TB, fault string) failoverResult {
	c := testcluster.Require(tb)
	if fault == faultPGFailover {
		c.SetPGSync(tb, true)
	}
	pool := clusterPool(tb, c)
	tables := idem.Tables{Schema: testdb.Name(tb, "f")}
	migrateCluster(tb, pool, tables)
	effects := tables.QuotedSchema() + ".effects"
	exec(tb, pool, `CREATE TABLE `+effects+` (message_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)

	name, queue := testdb.Name(tb, "w"), testdb.Name(tb, "q")
	tb.Cleanup(func() { c.DeleteQueues(tb, queue, queue+".retry", queue+".dlq") })
	workerURLs := c.AMQPURLs
	var proxies map[string]*faultproxy.Proxy
	if fault == faultBlackholeWorkerNode {
		workerURLs, proxies = proxiedNodes(tb, c)
	}
	w, err := consumer.New(consumer.Config{
		Name: name, Queue: queue, Pool: pool, AMQPURLs: workerURLs, Tables: tables,
		HandlerTimeout: 5 * time.Second, Logger: testrun.Logger(),
	})
	require.NoError(tb, err)
	w.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (message_id) VALUES ($1)`, m.ID)
		return err
	})
	stopWorker := testrun.Start(tb, w.Run)

	var r failoverResult
	conn := workerConnection(tb, c, "idem:"+name)
	c.WaitForQueue(tb, queue)
	r.nodeBefore, r.connBefore = conn.Node, conn.Name
	switch fault {
	case faultWorkerNode:
		r.victim = r.nodeBefore
	case faultFreezeWorkerNode, faultFreezeLeader, faultBlackholeWorkerNode:
		r.victim = arrangeFreeze(tb, c, fault, queue, r.nodeBefore)
	case faultLeader, faultUnusedNode:
		leader := leaderOtherThan(tb, c, queue, r.nodeBefore)
		r.victim = leader
		if fault == faultUnusedNode {
			r.victim = otherNode(c, r.nodeBefore, leader)
		}
	}
	// The publisher stays off the killed node: a fault of the publisher is
	// not what the run measures.
	pubURLs := slices.Clone(c.AMQPURLs)
	if r.victim != "" {
		pubURLs = slices.DeleteFunc(pubURLs, func(u string) bool { return u == c.URL(tb, r.victim) })
	}
	pub := startPublisher(tb, pubURLs, queue)

	time.Sleep(failoverBefore)
	faultAt := time.Now()
	if fault == faultPGFailover {
		c.StopPGPrimary(tb)
		c.PromotePGStandby(tb)
		r.promotion = time.Since(faultAt)
	} else if frozen(fault) {
		c.Freeze(tb, r.victim)
	} else if fault == faultBlackholeWorkerNode {
		proxies[r.victim].Stall()
	} else {
		c.Kill(tb, r.victim)
	}
	time.Sleep(window(fault))
	if frozen(fault) {
		c.Thaw(tb, r.victim)
	} else if fault == faultBlackholeWorkerNode {
		proxies[r.victim].Resume()
	}
	r.published, r.publishErrors = pub.stop(tb)

	testrun.WaitFor(tb, 2*time.Minute, "every published message applied", func() bool {
		return countRows(pool, `SELECT count(DISTINCT message_id) FROM `+effects) >= r.published
	})
	if conn, ok := findConnection(tb, c, "idem:"+name); ok {
		r.nodeAfter, r.connAfter = conn.Node, conn.Name
	}
	stopWorker()

	r.counts = map[string]int{}
	var at []time.Time
	rows, err := pool.Query(context.Background(), `SELECT message_id, at FROM `+effects+` ORDER BY at`)
	require.NoError(tb, err)
	var id string
	var t time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &t}, func() error {
		r.counts[id]++
		at = append(at, t)
		return nil
	})
	require.NoError(tb, err)
	r.outage = longestGap(at, faultAt, faultAt.Add(window(fault)))
	r.baselineGap = longestGap(at, faultAt.Add(-failoverBefore+time.Second), faultAt)
	for _, t := range at {
		if t.After(faultAt.Add(r.promotion)) {
			r.appliedAfterFault++
		}
		if t.After(faultAt) && t.Before(faultAt.Add(window(fault))) {
			r.appliedInWindow++
		}
	}
	tb.Logf("%s: victim %q, worker on %s then %s, %d published (%d publish errors), outage %s (promotion %s), baseline gap %s",
		fault, r.victim, r.nodeBefore, r.nodeAfter, r.published, r.publishErrors, r.outage, r.promotion, r.baselineGap)
	if r.victim != "" && fault != faultBlackholeWorkerNode {
		c.Start(tb, r.victim)
	}
	if frozen(fault) {
		waitWhole(tb, c, r.victim)
	}
	if fault == faultPGFailover {
		c.RestorePG(tb)
	}
	return r
}

// longestGap returns the longest time in [from, to) without an applied
// message: between from and the first one after it, between two of them,
// or between the last one and to.
func longestGap(sorted []time.Time, from, to time.Time) time.Duration {
	var gap time.Duration
	last := from
	for _, t := range sorted {
		if t.Before(from) {
			continue
		}
		if t.After(to) {
			break
		}
		gap = max(gap, t.Sub(last))
		last = t
	}
	return max(gap, to.Sub(last))
}

func clusterPool(tb testing.TB, c *testcluster.Cluster) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), c.PGURL)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

func migrateCluster(tb testing.TB, pool *pgxpool.Pool, tables idem.Tables) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := migrate.Up(ctx, pool, tables)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
}

func exec(tb testing.TB, pool *pgxpool.Pool, sql string) {
	tb.Helper()
	_, err := pool.Exec(context.Background(), sql)
	require.NoError(tb, err)
}

// countRows returns the count sql returns, -1 while the database does not
// answer.
func countRows(pool *pgxpool.Pool, sql string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

// workerConnection waits for the worker's connection, named name, and
// returns it.
func workerConnection(tb testing.TB, c *testcluster.Cluster, name string) testcluster.Connection {
	tb.Helper()
	var conn testcluster.Connection
	testrun.WaitFor(tb, 30*time.Second, "the worker's connection listed", func() bool {
		var ok bool
		conn, ok = findConnection(tb, c, name)
		return ok
	})
	return conn
}

func findConnection(tb testing.TB, c *testcluster.Cluster, name string) (testcluster.Connection, bool) {
	tb.Helper()
	for _, conn := range c.Connections(tb) {
		if conn.ClientName == name {
			return conn, true
		}
	}
	return testcluster.Connection{}, false
}

// leaderOtherThan returns the leader of the quorum queue, moving it off
// node first when it is there: the node's member is shrunk away and added
// again, which hands leadership to another member.
func leaderOtherThan(tb testing.TB, c *testcluster.Cluster, queue, node string) string {
	tb.Helper()
	var q testcluster.QuorumQueue
	testrun.WaitFor(tb, 30*time.Second, "the queue's members online", func() bool {
		q = c.QuorumQueue(tb, queue)
		return q.Leader != "" && len(q.Online) == len(c.Nodes)
	})
	if q.Leader != node {
		return q.Leader
	}
	tb.Logf("the queue's leader is the worker's node %s: moving it", node)
	c.Queues(tb, node, "delete_member", queue, node)
	testrun.WaitFor(tb, 30*time.Second, "a leader off "+node, func() bool {
		q = c.QuorumQueue(tb, queue)
		return q.Leader != "" && q.Leader != node
	})
	c.Queues(tb, node, "add_member", queue, node)
	testrun.WaitFor(tb, 30*time.Second, "the member on "+node+" back", func() bool {
		return len(c.QuorumQueue(tb, queue).Online) == len(c.Nodes)
	})
	return q.Leader
}

// otherNode returns the node of c that is neither a nor b.
func otherNode(c *testcluster.Cluster, a, b string) string {
	for _, n := range c.Nodes {
		if n != a && n != b {
			return n
		}
	}
	return ""
}

// publisher publishes failoverRate messages per second, numbered from 0, in
// ticks of a few messages whose confirms it waits for; a tick that fails
// is published again on a new connection (to the same or another node):
// duplicates are what idem is for. It stops only after a tick that
// succeeded, so that every message it published is counted as sent; a
// tick that keeps failing for publishRetryAfterStop after stop was asked
// is given up, and the run fails.
type publisher struct {
	stopping chan struct{}
	done     chan struct{}
	sent     int  // confirmed, owned by the goroutine until done closes
	errs     int  // failed ticks and dials, likewise
	gaveUp   bool // a tick was left unconfirmed at the stop, likewise
}

// publishRetryAfterStop bounds how long a failing tick is retried once the
// publisher was asked to stop.
const publishRetryAfterStop = 30 * time.Second

const publishTick = 20 * time.Millisecond

func startPublisher(tb testing.TB, urls []string, queue string) *publisher {
	p := &publisher{stopping: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		perTick := failoverRate * int(publishTick) / int(time.Second)
		tick := time.NewTicker(publishTick)
		defer tick.Stop()
		var ch *amqp.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		var giveUpAt time.Time // set once stop was asked while a tick fails
		failed := func() bool {
			p.errs++
			select {
			case <-p.stopping:
				if giveUpAt.IsZero() {
					giveUpAt = time.Now().Add(publishRetryAfterStop)
				}
				p.gaveUp = time.Now().After(giveUpAt)
			default:
			}
			return p.gaveUp
		}
		for {
			if ch == nil {
				var err error
				if ch, err = publishChannel(urls); err != nil {
					if failed() {
						return
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			if err := publishTickOf(ch, queue, p.sent, perTick); err != nil {
				_ = ch.Close()
				ch = nil
				if failed() {
					return
				}
				continue
			}
			p.sent += perTick
			select {
			case <-p.stopping:
				return
			case <-tick.C:
			}
		}
	}()
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

// stop ends the publishing and returns how many messages were confirmed and
// how many ticks failed.
func (p *publisher) stop(tb testing.TB) (sent, errs int) {
	select {
	case <-p.stopping:
	default:
		close(p.stopping)
	}
	select {
	case <-p.done:
	case <-time.After(publishRetryAfterStop + time.Minute):
		tb.Fatalf("the publisher did not stop")
	}
	if p.gaveUp {
		tb.Fatalf("the publisher's last tick (messages %d…) was not confirmed within %s of the stop", p.sent, publishRetryAfterStop)
	}
	return p.sent, p.errs
}

func publishChannel(urls []string) (*amqp.Channel, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	go func() { // the connection ends with its channel
		<-ch.NotifyClose(make(chan *amqp.Error, 1))
		_ = conn.Close()
	}()
	return ch, nil
}

// publishTickOf publishes messages first … first+n-1 and waits for their
// confirms, for ten seconds at most.
func publishTickOf(ch *amqp.Channel, queue string, first, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for i := first; i < first+n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: failoverID(i), DeliveryMode: amqp.Persistent, Body: []byte(`{}`)})
		if err != nil {
			return err
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			return err
		}
		if !acked {
			return errors.New("nacked")
		}
	}
	return nil
}

// A worker whose pool reaches a standby (a URL naming one node, or a
// session that landed on it) is not ready, whatever its broker says: the
// standby refuses every write.
func TestAWorkerWhoseDatabaseIsAStandbyIsNotReady(t *testing.T) {
	c := testcluster.Require(t)
	pool, err := pgxpool.New(context.Background(), c.PGStandby(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	name, queue := testdb.Name(t, "w"), testdb.Name(t, "q")
	t.Cleanup(func() { c.DeleteQueues(t, queue, queue+".retry", queue+".dlq") })
	w, err := consumer.New(consumer.Config{
		Name: name, Queue: queue, Pool: pool, AMQPURLs: c.AMQPURLs,
		Tables: idem.Tables{Schema: testdb.Name(t, "f")}, Logger: testrun.Logger(),
	})
	require.NoError(t, err)
	w.Handle(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	testrun.Start(t, w.Run)
	workerConnection(t, c, "idem:"+name)
	testrun.WaitFor(t, 30*time.Second, "the worker reported not ready for its read-only database", func() bool {
		h := w.Health()
		return !h.Ready && strings.Contains(h.Reason, "read-only")
	})
}
