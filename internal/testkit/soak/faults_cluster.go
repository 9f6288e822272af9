package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// node kills, with kill -9, a RabbitMQ node the run's workers are connected
// to (the one killed the fewest times, see pickNode) and, nodeDownFor later
// and in the background, starts it again; the run does not settle before
// it runs. Recovery is the time until a message published after the kill
// was processed in every example.
func (in *injector) node(ctx context.Context, inj *injection) error {
	return in.nodeFault(ctx, inj, nodeFault{
		verb: "kill", undo: "start", what: "kill -9", undone: "started again", lasts: nodeDownFor,
	})
}

// freeze stops, with kill -STOP, a RabbitMQ node the run's workers are
// connected to (chosen as node chooses) and, nodeFrozenFor later and in
// the background, thaws it: a gray failure, where the node's connections
// stay open and nothing answers, so that its clients notice only by their
// heartbeats and timeouts. Recovery is the time until a message published
// after the freeze was processed in every example.
func (in *injector) freeze(ctx context.Context, inj *injection) error {
	return in.nodeFault(ctx, inj, nodeFault{
		verb: "freeze", undo: "thaw", what: "kill -STOP", undone: "thawed", lasts: nodeFrozenFor,
	})
}

// nodeFault is a fault of one RabbitMQ node that scripts/cluster.sh
// injects with verb and undoes with undo, lasts later.
type nodeFault struct {
	verb, undo   string        // the script's verbs
	what, undone string        // for the report: what the fault does, and its undoing
	lasts        time.Duration // from the fault to its undoing
}

// nodeFault injects f on a node the run's workers are connected to (the one
// hit the fewest times, see claimNode) and undoes it f.lasts later, in the
// background; the run does not settle before it is undone. A node down or
// frozen by an earlier fault runs again first (awaitNodesUp).
func (in *injector) nodeFault(ctx context.Context, inj *injection, f nodeFault) error {
	h, c := in.h, in.h.cluster
	if err := c.awaitNodesUp(ctx); err != nil {
		return err
	}
	conns := h.connectionsPerNode()
	i, err := c.claimNode(conns)
	if err != nil {
		return err
	}
	node := c.nodes[i]
	inj.Target, _, _ = strings.Cut(node, "@")
	if _, err := c.verb(ctx, f.verb, node); err != nil {
		// The fault may have half happened (a node that died on the way):
		// undo it, a no-op if the node runs.
		if rerr := c.restore(ctx, f.undo, node); rerr != nil {
			in.mu.Lock()
			inj.Unrestored = fmt.Sprintf("%s not %s: %v", node, f.undone, rerr)
			in.mu.Unlock()
		}
		c.nodeUp()
		return err
	}
	t0 := time.Now()
	inj.Detail = fmt.Sprintf("%s %s, %d worker connections on it", f.what, node, conns[i])
	h.restoring.Add(1)
	in.wg.Go(func() {
		defer h.restoring.Add(-1)
		defer c.nodeUp()
		select {
		case <-ctx.Done(): // the run ends: undo it at once
		case <-time.After(f.lasts):
		}
		began := time.Now()
		err := c.restore(ctx, f.undo, node)
		in.mu.Lock()
		defer in.mu.Unlock()
		if err != nil {
			inj.Unrestored = fmt.Sprintf("%s not %s: %v", node, f.undone, err)
			return
		}
		inj.Outcome = fmt.Sprintf("%s %s after the fault, in %s", f.undone, dur(began.Sub(t0)), dur(time.Since(began)))
	})
	in.watch(ctx, inj, t0, h.cfg.examples)
	return nil
}

// pgFailover stops the PostgreSQL primary at once and promotes the standby
// (scripts/cluster.sh pg-failover); rejoinAfter later, in the background, the
// old primary comes back as a fresh synchronous standby of the new one
// (pg-rejoin), and the run does not settle before it has. A retention fault
// at its doors is not failed over under: the operator's commands would
// fail with the primary, which is not what that fault tests. Recovery is the
// time from the stop until a message published after it was processed in
// every example.
func (in *injector) pgFailover(ctx context.Context, inj *injection) error {
	h, c := in.h, in.h.cluster
	if !in.retentionMu.TryLock() {
		return errors.New("a retention fault is at its doors")
	}
	defer in.retentionMu.Unlock()
	if err := c.claimFailover(); err != nil {
		return err
	}
	inj.Target = "postgresql"
	var port int
	if err := h.db.pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil {
		c.rejoined()
		return fmt.Errorf("find the primary: %w", err)
	}
	t0 := time.Now()
	if _, err := c.verb(ctx, "pg-failover"); err != nil {
		// The primary may be stopped already: bring the pair back.
		if rerr := c.restore(ctx, "pg-rejoin"); rerr != nil {
			in.mu.Lock()
			inj.Unrestored = fmt.Sprintf("no standby again: %v", rerr)
			in.mu.Unlock()
		}
		c.rejoined()
		return err
	}
	inj.Detail = fmt.Sprintf("primary on port %d stopped at once, the standby promoted in %s", port, dur(time.Since(t0)))
	// The soak's own sessions were with the old primary: new ones find the
	// new one, rather than each query finding out on a dead session.
	h.db.pool.Reset()
	h.restoring.Add(1)
	in.wg.Go(func() {
		defer h.restoring.Add(-1)
		defer c.rejoined()
		select {
		case <-ctx.Done(): // the run ends: rejoin at once
		case <-time.After(rejoinAfter):
		}
		began := time.Now()
		err := c.restore(ctx, "pg-rejoin")
		if err == nil {
			err = checkSync(context.WithoutCancel(ctx), h.cfg.pgURL)
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		if err != nil {
			inj.Unrestored = fmt.Sprintf("no synchronous standby again: %v", err)
			return
		}
		inj.Outcome = fmt.Sprintf("the old primary a synchronous standby again %s after the stop, in %s", dur(began.Sub(t0)), dur(time.Since(began)))
	})
	in.watch(ctx, inj, t0, h.cfg.examples)
	return nil
}

// connectionsPerNode counts the run's worker connections, AMQP and stream,
// to each node of the cluster.
func (h *harness) connectionsPerNode() []int {
	conns := make([]int, len(h.cluster.nodes))
	// A worker that exited meanwhile has no connection to count.
	socks, _ := h.workerSockets()
	for _, s := range socks {
		if i := h.cluster.nodeOfPort(s.remotePort); i >= 0 {
			conns[i]++
		}
	}
	return conns
}
