package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cluster mode (-cluster) runs the schedules on the topology of
// scripts/cluster.sh, which must be up with synchronous replication (up
// --sync, as make chaos-cluster does): a 3-node RabbitMQ cluster and a
// PostgreSQL primary with a streaming standby. The workers reach every node
// through a fault proxy each, and PostgreSQL through one proxy per node with
// target_session_attrs=read-write, so that conn_cut and the proxies'
// outages still apply and a failover is followed. The runner itself (its
// publisher, redrives, reads) goes to the nodes straight. The cluster's
// faults are driven with the script's verbs: kill, start, pg-stop-primary,
// pg-promote and pg-rejoin.

// Bounds of one verb of the script: it bounds each of its own waits (two
// minutes by default); a verb that puts the topology back is tried again
// a few times when it failed.
const (
	clusterVerbTimeout = 4 * time.Minute
	clusterVerbTries   = 3
	clusterVerbPause   = 5 * time.Second
)

// topology is scripts/cluster.sh's cluster, as a schedule breaks it.
type topology struct {
	script string
	// amqpURLs are the RabbitMQ nodes, idem1 first; pgNodeURLs each
	// PostgreSQL node alone; pgURL the primary, whichever node it is;
	// streamURLs the nodes' stream protocol, comma separated.
	amqpURLs, pgNodeURLs []string
	pgURL, streamURLs    string

	mu     sync.Mutex
	down   int  // the node a node_kill killed, until it runs again; 0: none
	pgDown bool // a pg_crash stopped the primary and did not put it back yet
}

// openTopology reads the URLs scripts/cluster.sh env prints (its ports come
// from the IDEM_CLUSTER_* variables it documents), and requires every part
// up and synchronous replication: asynchronous, a failover loses commits
// the workers were told had happened, by design, and the exactly-once
// checks would find that rather than a bug.
func openTopology(ctx context.Context) (*topology, error) {
	script, err := findScript()
	if err != nil {
		return nil, err
	}
	t := &topology{script: script}
	out, err := t.verb(ctx, "env")
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "="); ok {
			vars[k] = strings.Trim(v, `'"`)
		}
	}
	t.amqpURLs = splitList(vars["IDEM_CLUSTER_AMQP_URLS"])
	t.pgNodeURLs = splitList(vars["IDEM_CLUSTER_PG_NODE_URLS"])
	t.pgURL, t.streamURLs = vars["IDEM_CLUSTER_PG_URL"], vars["IDEM_CLUSTER_STREAM_URLS"]
	if len(t.amqpURLs) != clusterNodes || len(t.pgNodeURLs) != 2 || t.pgURL == "" || t.streamURLs == "" {
		return nil, fmt.Errorf("chaos: scripts/cluster.sh env: want %d RabbitMQ nodes, 2 PostgreSQL nodes and a stream URL each, got:\n%s", clusterNodes, out)
	}
	status, err := t.verb(ctx, "status")
	if err != nil {
		return nil, fmt.Errorf("chaos: the cluster is not all up (scripts/cluster.sh up --sync starts it): %w\n%s", err, status)
	}
	if !strings.Contains(status, "postgresql mode: sync") {
		return nil, errors.New("chaos: -cluster needs synchronous replication, or a failover would lose acknowledged commits: " +
			"run scripts/cluster.sh pg-mode sync (or up --sync, as make chaos-cluster does)")
	}
	return t, nil
}

// findScript is scripts/cluster.sh of the module this runs in: named by
// IDEM_CLUSTER_SCRIPT, or found from the working directory up.
func findScript() (string, error) {
	if s := os.Getenv("IDEM_CLUSTER_SCRIPT"); s != "" {
		return s, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	for {
		s := filepath.Join(dir, "scripts", "cluster.sh")
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("chaos: scripts/cluster.sh not found from the working directory up; set IDEM_CLUSTER_SCRIPT")
		}
		dir = parent
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// verb runs the script with args, within clusterVerbTimeout, and returns
// what it printed.
func (t *topology) verb(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, clusterVerbTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, t.script, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		return stdout.String(), fmt.Errorf("scripts/cluster.sh %s: %w: %s", strings.Join(args, " "), err,
			strings.Join(lines[max(0, len(lines)-5):], " / "))
	}
	return stdout.String(), nil
}

// restore runs a verb that puts the topology back, again when it failed; it
// runs to its end even when ctx has ended.
func (t *topology) restore(ctx context.Context, args ...string) error {
	ctx = context.WithoutCancel(ctx)
	var err error
	for try := range clusterVerbTries {
		if try > 0 {
			time.Sleep(clusterVerbPause)
		}
		if _, err = t.verb(ctx, args...); err == nil {
			return nil
		}
	}
	return err
}

// nodeKill kills node a.Node with kill -9; a node an earlier kill left down
// is started first, so that a majority keeps serving.
func (r *runner) nodeKill(ctx context.Context, a Action) error {
	t := r.cluster
	if err := r.nodeStart(ctx); err != nil {
		return err
	}
	node := 1 + (a.Node+clusterNodes-1)%clusterNodes
	if _, err := t.verb(ctx, "kill", strconv.Itoa(node)); err != nil {
		return err
	}
	t.mu.Lock()
	t.down = node
	t.mu.Unlock()
	r.door(doorNodeKilled)
	return nil
}

// nodeStart starts the node a kill left down, if any, and waits until it
// runs.
func (r *runner) nodeStart(ctx context.Context) error {
	t := r.cluster
	t.mu.Lock()
	node := t.down
	t.mu.Unlock()
	if node == 0 {
		return nil
	}
	if err := t.restore(ctx, "start", strconv.Itoa(node)); err != nil {
		return err
	}
	t.mu.Lock()
	t.down = 0
	t.mu.Unlock()
	r.door("rabbitmq node started again")
	return nil
}

// Doors the report requires of a cluster run: a node killed, the primary
// crashed.
const (
	doorNodeKilled    = "rabbitmq node killed (kill -9)"
	doorPGRestarted   = "postgresql crashed, restarted"
	doorPGFailedOver  = "postgresql crashed, failed over"
	pgReadinessWithin = 8 * time.Second
)

// pgCrash stops the primary at once, waits until worker 0's readiness
// reports the outage (at most 8s: readiness must tell the truth), holds it
// a.Millis more, then starts it again (crash recovery) or promotes the
// standby and brings the old primary back as its standby. The runner's
// own connections, which died with the primary, are dropped.
func (r *runner) pgCrash(ctx context.Context, a Action) error {
	t := r.cluster
	t.mu.Lock()
	t.pgDown = true
	t.mu.Unlock()
	if _, err := t.verb(ctx, "pg-stop-primary"); err != nil {
		return err
	}
	r.pgOut = true
	r.obs.note(func(o *observations) { o.outages++ })
	deadline := time.Now().Add(pgReadinessWithin)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if ready, ok := r.ready(ctx); ok && !ready {
			r.obs.note(func(o *observations) { o.outagesSeen++ })
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(a.Millis) * time.Millisecond):
	}
	door := doorPGRestarted
	if a.Fate == PGFailover {
		door = doorPGFailedOver
		if err := t.restore(ctx, "pg-promote"); err != nil {
			return err
		}
	}
	if err := r.pgBack(ctx); err != nil {
		return err
	}
	r.door(door)
	return nil
}

// pgBack puts the PostgreSQL pair back after a crash, if one is open: a
// primary and a streaming standby (pg-rejoin); the runner's pool forgets
// the connections that died.
func (r *runner) pgBack(ctx context.Context) error {
	t := r.cluster
	t.mu.Lock()
	down := t.pgDown
	t.mu.Unlock()
	if !down {
		return nil
	}
	if err := t.restore(ctx, "pg-rejoin"); err != nil {
		return err
	}
	t.mu.Lock()
	t.pgDown = false
	t.mu.Unlock()
	r.pgOut = false
	if r.pool != nil {
		r.pool.Reset()
	}
	return nil
}

// healCluster puts back what the cluster's faults left broken.
func (r *runner) healCluster(ctx context.Context) error {
	if r.cluster == nil {
		return nil
	}
	return errors.Join(r.pgBack(ctx), r.nodeStart(ctx))
}
