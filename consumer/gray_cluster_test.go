//go:build cluster

package consumer_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// Gray failures: the worker's node stops answering (kill -STOP) without
// closing anything. Its connections stay open and the kernel still accepts
// new ones; the worker notices by its heartbeat, dials the other nodes
// first, and bounds every call that sets a session up, so that the node
// costs seconds, not the connection's default heartbeat or a consume that
// never answers.
const (
	// faultFreezeWorkerNode freezes the worker's node, which does not lead
	// the queue: a majority that leads goes on serving.
	faultFreezeWorkerNode = "freeze-worker-node"
	// faultFreezeLeader freezes the worker's node, which leads the queue:
	// the queue serves again once the other members elected a leader.
	faultFreezeLeader = "freeze-leader"
	// faultBlackholeWorkerNode blackholes the worker's node, which does
	// not lead the queue: the worker reaches every node through a proxy of
	// its own, and the node's proxy stops passing bytes, both ways, on
	// every connection, open or new (TCP accepted, nothing answered), while
	// the node itself serves its peers and the publisher.
	faultBlackholeWorkerNode = "blackhole-worker-node"
	// freezeWindow is how long a node stays frozen: shorter than the net
	// tick, so that its peers never declare it down and only the queue's
	// own election moves on without it.
	freezeWindow = 20 * time.Second
	// blackholeWindow is how long a node stays blackholed.
	blackholeWindow = 15 * time.Second
	// grayTarget is the longest time without a message applied that a node
	// that stops answering, and does not lead the queue, may cost; the
	// tests allow twice as much, for a loaded machine, and
	// docs/operations.md gives the measured figures.
	grayTarget = 5 * time.Second
)

// A frozen node that does not lead the queue: the worker consumes through
// another node while it is frozen, and applies every message once.
func TestAFrozenWorkerNodeIsLeftForAnother(t *testing.T) {
	r := runFailover(t, faultFreezeWorkerNode)
	r.requireOnce(t)
	require.Positive(t, r.appliedInWindow, "messages applied while the node was frozen")
	require.NotEqual(t, r.victim, r.nodeAfter, "the worker consumes through another node")
	require.Less(t, r.outage, 2*grayTarget, "consuming again within seconds, through another node")
}

// A frozen node that leads the queue: the worker consumes through another
// node once the other members elected a leader, while the node is still
// frozen, and applies every message once.
func TestAFrozenLeaderIsLeftOnceANewLeaderIsElected(t *testing.T) {
	r := runFailover(t, faultFreezeLeader)
	r.requireOnce(t)
	require.Positive(t, r.appliedInWindow, "messages applied while the node was frozen")
	require.NotEqual(t, r.victim, r.nodeAfter, "the worker consumes through another node")
}

// A blackholed node that does not lead the queue: the worker consumes
// through another node while it is blackholed, within seconds, and applies
// every message once.
func TestABlackholedWorkerNodeIsLeftForAnother(t *testing.T) {
	r := runFailover(t, faultBlackholeWorkerNode)
	r.requireOnce(t)
	require.Positive(t, r.appliedInWindow, "messages applied while the node was blackholed")
	require.NotEqual(t, r.victim, r.nodeAfter, "the worker consumes through another node")
	require.Less(t, r.outage, 2*grayTarget, "consuming again within seconds, through another node")
}

func frozen(fault string) bool { return fault == faultFreezeWorkerNode || fault == faultFreezeLeader }

// window is how long a run goes on after its fault.
func window(fault string) time.Duration {
	switch {
	case frozen(fault):
		return freezeWindow
	case fault == faultBlackholeWorkerNode:
		return blackholeWindow
	}
	return failoverAfter
}

// proxiedNodes starts a proxy in front of each node of c and returns the
// nodes' URLs through them, in the order of c.AMQPURLs, and the proxies
// by node.
func proxiedNodes(tb testing.TB, c *testcluster.Cluster) ([]string, map[string]*faultproxy.Proxy) {
	tb.Helper()
	urls := make([]string, len(c.Nodes))
	proxies := make(map[string]*faultproxy.Proxy, len(c.Nodes))
	for i, node := range c.Nodes {
		u, err := url.Parse(c.URL(tb, node))
		require.NoError(tb, err)
		p := faultproxy.New(tb, u.Host)
		u.Host = p.Addr()
		urls[i], proxies[node] = u.String(), p
	}
	return urls, proxies
}

// arrangeFreeze returns the node to freeze, the worker's node, after
// placing the queue's leader as the fault wants it: off that node, or on
// it (the worker declared the queue there, so it leads unless an election
// moved it; then members are removed and added again until it does).
func arrangeFreeze(tb testing.TB, c *testcluster.Cluster, fault, queue, node string) string {
	tb.Helper()
	if fault == faultFreezeWorkerNode || fault == faultBlackholeWorkerNode {
		leaderOtherThan(tb, c, queue, node)
		return node
	}
	for range 6 {
		var q testcluster.QuorumQueue
		testrun.WaitFor(tb, 30*time.Second, "the queue's members online", func() bool {
			q = c.QuorumQueue(tb, queue)
			return q.Leader != "" && len(q.Online) == len(c.Nodes)
		})
		if q.Leader == node {
			return node
		}
		tb.Logf("the queue's leader is %s, not the worker's node %s: moving it", q.Leader, node)
		c.Queues(tb, q.Leader, "delete_member", queue, q.Leader)
		testrun.WaitFor(tb, 30*time.Second, "a leader off "+q.Leader, func() bool {
			l := c.QuorumQueue(tb, queue).Leader
			return l != "" && l != q.Leader
		})
		c.Queues(tb, q.Leader, "add_member", queue, q.Leader)
	}
	tb.Fatalf("could not make %s lead %s", node, queue)
	return ""
}

// waitWhole waits until every node sees every other running again, with no
// partition on record. A node frozen for longer than the net tick comes
// back to a cluster that declared it down; scripts/cluster.sh sets
// cluster_partition_handling = autoheal, which heals that by itself,
// within minutes at worst (see TestAFreezeLongerThanTheNetTickHealsByItself).
func waitWhole(tb testing.TB, c *testcluster.Cluster, victim string) {
	tb.Helper()
	thawed := time.Now()
	var split string // the first disagreement seen
	testrun.WaitFor(tb, 8*time.Minute, "every node running in one cluster again after the thaw of "+victim, func() bool {
		whole, why := c.Whole()
		if split == "" {
			split = why
		}
		return whole
	})
	if split != "" {
		tb.Logf("one cluster again %s after the thaw of %s (split before: %s)", time.Since(thawed).Round(time.Second), victim, split)
	}
}
