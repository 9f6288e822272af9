// Package testcluster gives idem's own tests the production topology that
// scripts/cluster.sh starts — a private 3-node RabbitMQ cluster and a
// PostgreSQL primary with a streaming standby, on spare ports — and the
// faults to drive in it: kill -9 a node and start it again, find the node a
// connection is attached to or a quorum queue's leader, stop the primary at
// once and promote the standby, and put everything back.
//
// Tests that use it carry the build tag `cluster`, so that `make test` never
// starts the cluster; `make cluster-test` runs them. A fault is cluster-wide:
// a test that injects one must not run in parallel with another test that
// uses the cluster, and packages run one at a time (go test -p 1).
//
// When the cluster cannot be started the test is skipped, except under
// CI=true or IDEM_CLUSTER=1, where it fails.
package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Timeouts of one call of scripts/cluster.sh. The script bounds each of its
// own waits (IDEM_CLUSTER_WAIT, two minutes); up waits for several things.
const (
	upTimeout   = 8 * time.Minute
	verbTimeout = 4 * time.Minute
)

// Cluster is the topology of scripts/cluster.sh as its URLs, and the script
// that drives it.
type Cluster struct {
	// AMQPURLs are the nodes' AMQP URLs, in the order of Nodes.
	AMQPURLs []string
	// Nodes are the RabbitMQ node names: idem1@localhost, idem2@localhost,
	// idem3@localhost.
	Nodes []string
	// PGNodeURLs reach each PostgreSQL node alone, whatever its role: the
	// node created as primary first.
	PGNodeURLs []string
	// PGURL reaches whichever PostgreSQL node is primary: it lists both hosts
	// with target_session_attrs=read-write.
	PGURL string
	// StreamURLs are the nodes' stream protocol URIs, in the order of Nodes.
	StreamURLs []string

	script   string
	frozenMu sync.Mutex
	frozen   map[string]bool // nodes frozen by Freeze: rabbitmqctl would hang on them
}

var (
	mu     sync.Mutex
	shared *Cluster
	upErr  error
)

// Require returns the cluster, started by scripts/cluster.sh up the first
// time in a test binary and reused afterwards (started again when a node
// stopped answering). The script is found at the module root, or named by
// IDEM_CLUSTER_SCRIPT; its own settings (ports, state dir) come from the
// IDEM_CLUSTER_* variables it documents. When the cluster cannot be started,
// the test is skipped, or fails under CI=true or IDEM_CLUSTER=1.
func Require(tb testing.TB) *Cluster {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if upErr == nil && (shared == nil || !shared.answers()) {
		shared, upErr = up()
	}
	if upErr != nil {
		if os.Getenv("CI") == "true" || os.Getenv("IDEM_CLUSTER") == "1" {
			tb.Fatalf("testcluster: the cluster is required (CI=true or IDEM_CLUSTER=1) and did not start: %v", upErr)
		}
		tb.Skipf("testcluster: the cluster did not start, skipping (set IDEM_CLUSTER=1 to fail instead): %v", upErr)
	}
	return shared
}

func up() (*Cluster, error) {
	script, err := scriptPath()
	if err != nil {
		return nil, err
	}
	c := &Cluster{script: script}
	out, err := c.run(upTimeout, "up")
	if err != nil {
		return nil, err
	}
	if err := c.parse(out); err != nil {
		return nil, err
	}
	return c, nil
}

// scriptPath finds scripts/cluster.sh at the module root above the working
// directory, or takes IDEM_CLUSTER_SCRIPT.
func scriptPath() (string, error) {
	if s := os.Getenv("IDEM_CLUSTER_SCRIPT"); s != "" {
		return s, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "scripts", "cluster.sh"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory to find scripts/cluster.sh from")
		}
		dir = parent
	}
}

// parse reads the export lines that up and env print.
func (c *Cluster) parse(out string) error {
	vars := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if ok {
			vars[k] = strings.Trim(v, "'")
		}
	}
	list := func(k string) []string {
		if vars[k] == "" {
			return nil
		}
		return strings.Split(vars[k], ",")
	}
	c.Nodes, c.AMQPURLs, c.StreamURLs = list("IDEM_CLUSTER_NODES"), list("IDEM_CLUSTER_AMQP_URLS"), list("IDEM_CLUSTER_STREAM_URLS")
	c.PGURL, c.PGNodeURLs = vars["IDEM_CLUSTER_PG_URL"], list("IDEM_CLUSTER_PG_NODE_URLS")
	if len(c.Nodes) == 0 || len(c.AMQPURLs) != len(c.Nodes) || c.PGURL == "" || len(c.PGNodeURLs) != 2 {
		return fmt.Errorf("scripts/cluster.sh printed no usable URLs: %q", out)
	}
	return nil
}

// answers tells whether every node and both PostgreSQL nodes accept TCP
// connections.
func (c *Cluster) answers() bool {
	for _, u := range append(append([]string{}, c.AMQPURLs...), c.PGNodeURLs...) {
		if !listening(hostOf(u)) {
			return false
		}
	}
	return true
}

func hostOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Host
}

func listening(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// run runs scripts/cluster.sh with args within timeout and returns what it
// printed on stdout; an error carries the end of its stderr.
func (c *Cluster) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.script, args...)
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("not within %s: %w", timeout, ctx.Err())
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = "…" + msg[len(msg)-2000:]
		}
		return stdout.String(), fmt.Errorf("scripts/cluster.sh %s: %w\n%s", strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

// must runs the script for a test and ends the test when it fails.
func (c *Cluster) must(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := c.run(verbTimeout, args...)
	if err != nil {
		tb.Fatalf("testcluster: %v", err)
	}
	return out
}
