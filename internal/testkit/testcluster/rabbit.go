package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
)

// URL returns the AMQP URL of node, one of Nodes.
func (c *Cluster) URL(tb testing.TB, node string) string {
	tb.Helper()
	return c.AMQPURLs[c.index(tb, node)]
}

func (c *Cluster) index(tb testing.TB, node string) int {
	tb.Helper()
	i := slices.Index(c.Nodes, node)
	if i < 0 {
		tb.Fatalf("testcluster: no node %q (nodes: %v)", node, c.Nodes)
	}
	return i
}

// Kill kills node with SIGKILL, as a crash or a lost host would, and returns
// once its process is gone and its port closed. Unless the test started it
// again, the node is started when the test ends.
func (c *Cluster) Kill(tb testing.TB, node string) {
	tb.Helper()
	c.must(tb, "kill", node)
	tb.Cleanup(func() {
		if listening(hostOf(c.URL(tb, node))) {
			return
		}
		if _, err := c.run(verbTimeout, "start", node); err != nil {
			tb.Errorf("testcluster: restart %s after the test: %v", node, err)
		}
	})
}

// Freeze stops node's process with SIGSTOP: a gray failure. Its sockets
// stay open and the kernel still accepts TCP connections on its ports, but
// nothing answers: its clients notice only by their heartbeats or timeouts,
// and its peers only when the net tick runs out. The node is thawed when the
// test ends, unless the test thawed it.
func (c *Cluster) Freeze(tb testing.TB, node string) {
	tb.Helper()
	c.must(tb, "freeze", node)
	c.setFrozen(node, true)
	tb.Cleanup(func() {
		if _, err := c.run(verbTimeout, "thaw", node); err != nil {
			tb.Errorf("testcluster: thaw %s after the test: %v", node, err)
		}
		c.setFrozen(node, false)
	})
}

// Thaw lets a frozen node run again (SIGCONT); a node that is not frozen is
// left alone.
func (c *Cluster) Thaw(tb testing.TB, node string) {
	tb.Helper()
	c.must(tb, "thaw", node)
	c.setFrozen(node, false)
}

func (c *Cluster) setFrozen(node string, frozen bool) {
	c.frozenMu.Lock()
	defer c.frozenMu.Unlock()
	if c.frozen == nil {
		c.frozen = map[string]bool{}
	}
	c.frozen[node] = frozen
}

// serving tells whether node i accepts connections and is not frozen.
func (c *Cluster) serving(i int) bool {
	c.frozenMu.Lock()
	frozen := c.frozen[c.Nodes[i]]
	c.frozenMu.Unlock()
	return !frozen && listening(hostOf(c.AMQPURLs[i]))
}

// Start starts node and returns once it accepts connections. A node that was
// killed rejoins its cluster by itself; its quorum queue members catch up
// after that, see QuorumQueue.
func (c *Cluster) Start(tb testing.TB, node string) {
	tb.Helper()
	c.must(tb, "start", node)
}

// Ctl runs rabbitmqctl against node with the cluster's environment (its
// cookie, its epmd) and returns what it printed: for what the other methods
// do not cover.
func (c *Cluster) Ctl(tb testing.TB, node string, args ...string) string {
	tb.Helper()
	return c.must(tb, append([]string{"ctl", node}, args...)...)
}

// Queues runs rabbitmq-queues against node with the cluster's environment
// and returns what it printed: to move a quorum queue's members, for
// example.
func (c *Cluster) Queues(tb testing.TB, node string, args ...string) string {
	tb.Helper()
	return c.must(tb, append([]string{"queues", node}, args...)...)
}

// ctlAny runs rabbitmqctl on the first node that answers.
func (c *Cluster) ctlAny(tb testing.TB, args ...string) string {
	tb.Helper()
	for i, node := range c.Nodes {
		if c.serving(i) {
			return c.Ctl(tb, node, args...)
		}
	}
	tb.Fatalf("testcluster: no RabbitMQ node answers")
	return ""
}

// Running returns the nodes running in the cluster as node sees them,
// sorted.
func (c *Cluster) Running(tb testing.TB, node string) []string {
	tb.Helper()
	out := c.Ctl(tb, node, "-q", "eval", "lists:sort(rabbit_nodes:all_running()).")
	var nodes []string
	for _, n := range strings.Split(strings.Trim(strings.Join(strings.Fields(out), ""), "[]"), ",") {
		if n != "" {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// Whole reports whether every node answers, sees every node running and
// has no partition on record; when not, it says what the first node that
// disagrees sees. Unlike Running it never fails the test: a node that is
// restarting (autoheal restarts the nodes of the side that lost) does not
// answer for a while.
func (c *Cluster) Whole() (bool, string) {
	want := fmt.Sprintf("{%d,0}", len(c.Nodes))
	for _, node := range c.Nodes {
		out, err := c.run(30*time.Second, "ctl", node, "-q", "eval",
			"{length(rabbit_nodes:all_running()), length(rabbit_node_monitor:partitions())}.")
		if err != nil {
			return false, fmt.Sprintf("%s: %v", node, err)
		}
		if got := strings.Join(strings.Fields(out), ""); got != want {
			return false, fmt.Sprintf("%s: {running, partitions} = %s", node, got)
		}
	}
	return true, ""
}

// Connection is a client's AMQP connection as the cluster lists it.
type Connection struct {
	// ClientName is the connection_name client property, if the client gave one.
	ClientName string
	// Name is the broker's name for it: "client address -> node address".
	Name string
	// Node is the node the connection is attached to.
	Node string
	// PeerPort is the client's own port.
	PeerPort int
}

// Connections lists the AMQP connections of every running node.
func (c *Cluster) Connections(tb testing.TB) []Connection {
	tb.Helper()
	out := c.ctlAny(tb, "-q", "list_connections", "name", "port", "peer_port", "client_properties", "--formatter", "json")
	var rows []struct {
		Name             string              `json:"name"`
		Port             int                 `json:"port"`
		PeerPort         int                 `json:"peer_port"`
		ClientProperties [][]json.RawMessage `json:"client_properties"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		tb.Fatalf("testcluster: list_connections: %v in %q", err, out)
	}
	conns := make([]Connection, 0, len(rows))
	for _, r := range rows {
		conn := Connection{Name: r.Name, PeerPort: r.PeerPort, Node: c.nodeOnPort(r.Port)}
		for _, p := range r.ClientProperties {
			var key, value string
			if len(p) == 3 && json.Unmarshal(p[0], &key) == nil && key == "connection_name" && json.Unmarshal(p[2], &value) == nil {
				conn.ClientName = value
			}
		}
		conns = append(conns, conn)
	}
	return conns
}

// nodeOnPort returns the node whose AMQP listener is port.
func (c *Cluster) nodeOnPort(port int) string {
	for i, u := range c.AMQPURLs {
		if p, err := url.Parse(u); err == nil && p.Port() == strconv.Itoa(port) {
			return c.Nodes[i]
		}
	}
	return ""
}

// NodeOf returns the node that conn is attached to, as the cluster sees it
// (so also through a proxy): the connection whose peer port is conn's local
// port. It waits up to ten seconds for the connection to be listed.
func (c *Cluster) NodeOf(tb testing.TB, conn *amqp.Connection) string {
	tb.Helper()
	addr, ok := conn.LocalAddr().(*net.TCPAddr)
	if !ok || addr.Port == 0 {
		tb.Fatalf("testcluster: connection has no local TCP address (%v)", conn.LocalAddr())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, listed := range c.Connections(tb) {
			if listed.PeerPort == addr.Port {
				return listed.Node
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testcluster: no node lists a connection from port %d", addr.Port)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// QuorumQueue is where a quorum queue's replicas are.
type QuorumQueue struct {
	// Leader is the node of the member that leads, empty while there is none.
	Leader string
	// Members are the nodes holding a replica, sorted.
	Members []string
	// Online are the members that run, sorted.
	Online []string
}

// QuorumQueue returns the replicas of the quorum queue (or stream) name in
// the default virtual host, as a running node sees them now; a test that
// waits for an election or a member to catch up polls it. It ends the test
// when no node can tell; see Replicas.
func (c *Cluster) QuorumQueue(tb testing.TB, name string) QuorumQueue {
	tb.Helper()
	q, err := c.Replicas(name)
	if err != nil {
		tb.Fatalf("testcluster: %v", err)
	}
	return q
}

// Replicas is QuorumQueue returning what went wrong: a node that cannot
// list its queues for now (RabbitMQ 3.10 fails to list a stream one of
// whose members does not run), or no such queue.
func (c *Cluster) Replicas(name string) (QuorumQueue, error) {
	node := ""
	for i, n := range c.Nodes {
		if c.serving(i) {
			node = n
			break
		}
	}
	if node == "" {
		return QuorumQueue{}, fmt.Errorf("no RabbitMQ node answers")
	}
	out, err := c.run(verbTimeout, "ctl", node, "-q", "list_queues", "name", "type", "leader", "members", "online", "--formatter", "json")
	if err != nil {
		return QuorumQueue{}, err
	}
	var rows []struct {
		Name    string   `json:"name"`
		Type    string   `json:"type"`
		Leader  any      `json:"leader"`
		Members []string `json:"members"`
		Online  []string `json:"online"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		return QuorumQueue{}, fmt.Errorf("list_queues: %w in %q", err, out)
	}
	for _, r := range rows {
		if r.Name != name {
			continue
		}
		if r.Type != "quorum" && r.Type != "stream" {
			return QuorumQueue{}, fmt.Errorf("queue %s is %s, not quorum or stream", name, r.Type)
		}
		q := QuorumQueue{Members: r.Members, Online: r.Online}
		if s, ok := r.Leader.(string); ok && slices.Contains(c.Nodes, s) {
			q.Leader = s
		}
		slices.Sort(q.Members)
		slices.Sort(q.Online)
		return q, nil
	}
	return QuorumQueue{}, fmt.Errorf("no queue %s", name)
}

// DeleteQueues deletes the queues named through whichever node answers,
// as a test's clean-up; what it cannot delete it reports with tb.Logf.
func (c *Cluster) DeleteQueues(tb testing.TB, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := amqpnodes.Dial(ctx, c.AMQPURLs, amqp.Config{})
	if err != nil {
		tb.Logf("testcluster: delete queues %v: %v", names, err)
		return
	}
	defer conn.Close()
	for _, name := range names {
		// A failed delete closes its channel: one channel per queue.
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
		if err != nil {
			tb.Logf("testcluster: delete queue %s: %v", name, err)
		}
	}
}

// WaitForQueue waits up to a minute for the queue name to exist, as a
// worker declares it after its connection opened: a message published
// before would be dropped, unroutable.
func (c *Cluster) WaitForQueue(tb testing.TB, name string) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if c.queueExists(name) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testcluster: queue %s not declared within a minute", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) queueExists(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := amqpnodes.Dial(ctx, c.AMQPURLs, amqp.Config{})
	if err != nil {
		return false
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err == nil
}

// StreamReaders returns the nodes that hold a stream protocol connection
// with at least one subscription (a reader), as a running node lists them;
// a node twice when two readers are on it.
func (c *Cluster) StreamReaders(tb testing.TB) []string {
	tb.Helper()
	out := c.ctlAny(tb, "-q", "list_stream_connections", "port", "subscriptions", "--formatter", "json")
	var rows []struct {
		Port          int `json:"port"`
		Subscriptions int `json:"subscriptions"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		tb.Fatalf("testcluster: list_stream_connections: %v in %q", err, out)
	}
	var nodes []string
	for _, r := range rows {
		if r.Subscriptions == 0 {
			continue
		}
		for i, u := range c.StreamURLs {
			if p, err := url.Parse(u); err == nil && p.Port() == strconv.Itoa(r.Port) {
				nodes = append(nodes, c.Nodes[i])
			}
		}
	}
	return nodes
}
