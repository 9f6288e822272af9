package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The cluster faults break the topology of scripts/cluster.sh: a 3-node
// RabbitMQ cluster and a PostgreSQL primary with a streaming standby. The
// soak drives them with the script's verbs, and only when its URLs point at
// that cluster (matchCluster): it never kills a broker or stops a database
// it was not told it may.
const (
	// faultNode kills a RabbitMQ node with kill -9 and starts it again
	// nodeDownFor later.
	faultNode = "node"
	// faultPGFailover stops the PostgreSQL primary at once and promotes the
	// standby; rejoinAfter later, the old primary comes back as a fresh
	// standby of the new one.
	faultPGFailover = "pgfailover"
	// faultFreeze stops a RabbitMQ node with kill -STOP (a gray failure: its
	// connections stay open and nothing answers) and thaws it nodeFrozenFor
	// later.
	faultFreeze = "freeze"
)

// isClusterFault reports whether fault f needs scripts/cluster.sh's
// topology.
func isClusterFault(f string) bool { return f == faultNode || f == faultPGFailover || f == faultFreeze }

// Timing of the cluster faults. A node fault holds its node down for
// nodeDownFor, then waits for it to start (about 10s on two cores); node
// events are nodeEvery apart at least, so that one node at most is down and
// a majority always serves. A failover's old primary rejoins as a standby
// rejoinAfter later (a base backup, a few seconds); failovers are
// failoverEvery apart at least, so that each one has a synchronous standby
// to promote.
const (
	nodeDownFor   = 5 * time.Second
	nodeFrozenFor = 5 * time.Second // well within the cluster's net tick (10 s ± 25 %): no partition
	nodeEvery     = 30 * time.Second
	rejoinAfter   = 5 * time.Second
	failoverEvery = 30 * time.Second
)

// Bounds of the script's verbs. Each of its own waits is bounded (two
// minutes by default), and so is the wait for its lock, which another
// user of the cluster may hold: a verb that puts the cluster back is tried
// again, a few times, when it failed.
const (
	clusterVerbTimeout = 4 * time.Minute
	clusterVerbTries   = 3
	clusterVerbPause   = 5 * time.Second
)

// cluster is scripts/cluster.sh's topology, as the cluster faults drive it.
type cluster struct {
	script string
	// nodes are the RabbitMQ node names; amqpPorts and streamPorts their
	// ports, in the same order.
	nodes                  []string
	amqpPorts, streamPorts []int

	mu          sync.Mutex
	down        string         // the node a node fault killed, until it runs again
	kills       map[string]int // node faults per node
	failingOver bool           // from a failover until its old primary rejoined
}

// openCluster reads the topology scripts/cluster.sh describes, refuses a
// configuration whose URLs point elsewhere, and requires every part of it
// up and, for the pgfailover fault, synchronous replication.
func openCluster(ctx context.Context, cfg config) (*cluster, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, err
	}
	c := &cluster{script: filepath.Join(root, "scripts", "cluster.sh"), kills: map[string]int{}}
	out, err := c.verb(ctx, "env")
	if err != nil {
		return nil, err
	}
	vars := exports(out)
	if err := matchCluster(cfg, vars); err != nil {
		return nil, err
	}
	if err := c.read(vars); err != nil {
		return nil, err
	}
	if out, err := c.verb(ctx, "status"); err != nil {
		return nil, fmt.Errorf("the cluster is not all up (scripts/cluster.sh up starts what is missing): %w\n%s", err, out)
	}
	if cfg.has(faultPGFailover) {
		if err := checkSync(ctx, cfg.pgURL); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// exports reads the export lines scripts/cluster.sh env prints.
func exports(out string) map[string]string {
	vars := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if ok {
			vars[k] = strings.Trim(v, `'"`)
		}
	}
	return vars
}

// read takes the node names and ports from the script's variables.
func (c *cluster) read(vars map[string]string) error {
	c.nodes = splitList(vars["IDEM_CLUSTER_NODES"])
	var err error
	if c.amqpPorts, err = portsOf(splitList(vars["IDEM_CLUSTER_AMQP_URLS"]), 5672); err != nil {
		return err
	}
	if c.streamPorts, err = portsOf(splitList(vars["IDEM_CLUSTER_STREAM_URLS"]), 5552); err != nil {
		return err
	}
	if len(c.nodes) < 3 || len(c.amqpPorts) != len(c.nodes) || len(c.streamPorts) != len(c.nodes) {
		return fmt.Errorf("scripts/cluster.sh env: want 3 nodes or more, each with an AMQP and a stream URL; got nodes %q", c.nodes)
	}
	return nil
}

// matchCluster refuses the cluster faults unless the run's broker and
// database URLs are those of the cluster scripts/cluster.sh env describes
// (vars): the AMQP and stream URLs name its nodes, all of them, and the
// PostgreSQL URL lists both its hosts with target_session_attrs=read-write,
// so that the workers follow a failover. The error names hosts and ports,
// never a password.
func matchCluster(cfg config, vars map[string]string) error {
	faults := strings.Join(slices.DeleteFunc(slices.Clone(cfg.faults), func(f string) bool { return !isClusterFault(f) }), " and ")
	mismatch := func(what string, got, want []string) error {
		return fmt.Errorf("-faults %s: the soak breaks the cluster of scripts/cluster.sh only, and %s names %s, not its nodes %s: "+
			`eval "$(scripts/cluster.sh env)" and run with IDEM_AMQP_URL=$IDEM_CLUSTER_AMQP_URLS IDEM_STREAM_URL=$IDEM_CLUSTER_STREAM_URLS `+
			"IDEM_PG_URL=$IDEM_CLUSTER_PG_URL, as make soak-cluster does", faults, what, strings.Join(got, ","), strings.Join(want, ","))
	}
	pairs := []struct {
		what, got, want string
		port            int
	}{
		{"IDEM_AMQP_URL (-amqp-url)", strings.Join(cfg.amqpURLs, ","), vars["IDEM_CLUSTER_AMQP_URLS"], 5672},
		{"IDEM_STREAM_URL", cfg.streamURL, vars["IDEM_CLUSTER_STREAM_URLS"], 5552},
	}
	for _, p := range pairs {
		got, err := hostsOf(splitList(p.got), p.port)
		if err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
		want, err := hostsOf(splitList(p.want), p.port)
		if err != nil || len(want) == 0 {
			return fmt.Errorf("scripts/cluster.sh env: no usable node list for %s", p.what)
		}
		if !slices.Equal(got, want) {
			return mismatch(p.what, got, want)
		}
	}
	got, rw, err := pgHosts(cfg.pgURL)
	if err != nil {
		return fmt.Errorf("IDEM_PG_URL: %w", err)
	}
	want, _, err := pgHosts(vars["IDEM_CLUSTER_PG_URL"])
	if err != nil || len(want) < 2 {
		return errors.New("scripts/cluster.sh env: no usable IDEM_CLUSTER_PG_URL")
	}
	if !slices.Equal(got, want) {
		return mismatch("IDEM_PG_URL", got, want)
	}
	if !rw {
		return fmt.Errorf("-faults %s: IDEM_PG_URL lists the cluster's hosts without target_session_attrs=read-write: "+
			"after a failover the workers could land on the standby", faults)
	}
	return nil
}

// hostsOf returns the host:port of each URL, sorted, def standing for a
// missing port.
func hostsOf(urls []string, def int) ([]string, error) {
	var out []string
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("no host in URL %d of %d", len(out)+1, len(urls))
		}
		out = append(out, withPort(u.Host, def))
	}
	slices.Sort(out)
	return out, nil
}

// pgHosts returns the host:port of each host a PostgreSQL URL lists
// (postgres://h1:5432,h2:5433/db), sorted, and whether it asks for a
// read-write session.
func pgHosts(raw string) (hosts []string, readWrite bool, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, false, errors.New("not a postgres:// URL with a host")
	}
	for _, h := range strings.Split(u.Host, ",") {
		hosts = append(hosts, withPort(h, 5432))
	}
	slices.Sort(hosts)
	return hosts, u.Query().Get("target_session_attrs") == "read-write", nil
}

func withPort(hostport string, def int) string {
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return hostport
	}
	return net.JoinHostPort(strings.Trim(hostport, "[]"), strconv.Itoa(def))
}

// portsOf returns the port of each URL, def standing for a missing one.
func portsOf(urls []string, def int) ([]int, error) {
	out := make([]int, len(urls))
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("URL %d of %d: not a URL", i+1, len(urls))
		}
		out[i] = def
		if u.Port() != "" {
			if out[i], err = strconv.Atoi(u.Port()); err != nil {
				return nil, fmt.Errorf("URL %d of %d: port %q", i+1, len(urls), u.Port())
			}
		}
	}
	return out, nil
}

// checkSync refuses asynchronous replication: a failover then loses commits
// the workers were told had happened, and messages acked after them, by
// design, and the exactly-once checks would find that rather than a bug.
func checkSync(ctx context.Context, pgURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var commit, names string
	var syncStandby bool
	err = conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).Scan(&commit, &names, &syncStandby)
	if err != nil {
		return fmt.Errorf("read the replication settings: %w", err)
	}
	return syncVerdict(commit, names, syncStandby)
}

// syncVerdict says whether a primary with these settings loses no commit
// it acknowledged when it is lost: a synchronous standby streams from it and
// a commit waits for that standby.
func syncVerdict(commit, names string, syncStandby bool) error {
	const how = "run scripts/cluster.sh pg-mode sync (or up --sync), as make soak-cluster does"
	switch {
	case names == "" || !syncStandby:
		return errors.New("-faults pgfailover needs synchronous replication, and PostgreSQL replicates asynchronously: " +
			"a failover would lose commits, and with them the writes of messages already acked (docs/operations.md, What durability needs); " + how)
	case commit == "off" || commit == "local":
		return fmt.Errorf("-faults pgfailover needs synchronous replication, and synchronous_commit is %s: a commit does not wait for the standby; %s", commit, how)
	}
	return nil
}

// verb runs the script with args, within clusterVerbTimeout, and returns
// what it printed.
func (c *cluster) verb(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, clusterVerbTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.script, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("scripts/cluster.sh %s: %w: %s", strings.Join(args, " "), err, lastLines(stderr.String(), 5))
	}
	return stdout.String(), nil
}

// restore runs a verb that puts the cluster back, trying again when it
// failed (another user of the cluster may have been breaking it at the
// same time). It runs to its end even when ctx has ended.
func (c *cluster) restore(ctx context.Context, args ...string) error {
	ctx = context.WithoutCancel(ctx)
	var err error
	for try := range clusterVerbTries {
		if try > 0 {
			time.Sleep(clusterVerbPause)
		}
		if _, err = c.verb(ctx, args...); err == nil {
			return nil
		}
	}
	return err
}

// ctl is the command that runs rabbitmqctl on a node that is up.
func (c *cluster) ctl() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n != c.down {
			return []string{c.script, "ctl", n}
		}
	}
	return []string{c.script, "ctl", c.nodes[0]}
}

// nodeOfPort returns the index of the node that listens on port (AMQP or
// stream), or -1.
func (c *cluster) nodeOfPort(port int) int {
	if i := slices.Index(c.amqpPorts, port); i >= 0 {
		return i
	}
	return slices.Index(c.streamPorts, port)
}

// claimNode picks the node to kill, given the run's worker connections per
// node (see pickNode), and marks it down; it refuses while another node is
// down, or when a node does not answer (someone else's fault): a majority
// must keep serving.
func (c *cluster) claimNode(conns []int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down != "" {
		return -1, fmt.Errorf("%s is not running again yet", c.down)
	}
	for i, port := range c.amqpPorts { // the script's nodes listen on 127.0.0.1
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err != nil {
			return -1, fmt.Errorf("%s does not answer (down already, not by this run): a majority must stay up", c.nodes[i])
		}
		conn.Close()
	}
	kills := make([]int, len(c.nodes))
	for i, n := range c.nodes {
		kills[i] = c.kills[n]
	}
	i := pickNode(conns, kills)
	c.down = c.nodes[i]
	c.kills[c.down]++
	return i, nil
}

// nodeWait bounds how long a node fault waits for the node an earlier one
// killed or froze to run again: two nodes down or frozen at once would leave
// the cluster no majority: its quorum queues would stop.
const nodeWait = 90 * time.Second

// awaitNodesUp waits until no node is down or frozen by this run, at most
// nodeWait, so that a node fault scheduled while one is down is injected
// late rather than not at all.
func (c *cluster) awaitNodesUp(ctx context.Context) error {
	deadline := time.Now().Add(nodeWait)
	for {
		c.mu.Lock()
		down := c.down
		c.mu.Unlock()
		if down == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not running again after %s", down, nodeWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodeUp records that the node killed is running again (or that it was
// not killed after all).
func (c *cluster) nodeUp() {
	c.mu.Lock()
	c.down = ""
	c.mu.Unlock()
}

// pickNode picks the node to kill: of those the run's workers are connected
// to (conns, per node), the one killed the fewest times (kills), then the
// one with the most connections; when no worker connection is found, the
// node killed the fewest times.
func pickNode(conns, kills []int) int {
	best := -1
	for i := range kills {
		switch {
		case best < 0:
			best = i
		case (conns[i] > 0) != (conns[best] > 0):
			if conns[i] > 0 {
				best = i
			}
		case kills[i] != kills[best]:
			if kills[i] < kills[best] {
				best = i
			}
		case conns[i] > conns[best]:
			best = i
		}
	}
	return best
}

// claimFailover marks a failover under way; it refuses while the last
// one's old primary has not rejoined as a standby.
func (c *cluster) claimFailover() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failingOver {
		return errors.New("the last failover's old primary has not rejoined as a standby yet")
	}
	c.failingOver = true
	return nil
}

// rejoined records that the pair has a standby again (or that the
// failover did not happen).
func (c *cluster) rejoined() {
	c.mu.Lock()
	c.failingOver = false
	c.mu.Unlock()
}

// lastLines returns the last n lines of s, on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}
