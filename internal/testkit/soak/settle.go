package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

// settle waits until the run has nothing left to do: the cluster whole
// again after the cluster faults (then it reads the stream's tail), every
// worker running,
// the queues and retry queues empty with nothing unacknowledged, the orders
// checkpoint at the stream's tail, and no capture or e-mail effect pending,
// in flight or waiting for a retry — twice in a row, a second apart.
func (h *harness) settle(ctx context.Context) error {
	h.tail = -1
	tailRead := !h.cfg.runs(orders)
	stable := 0
	state := "not checked yet"
	for {
		busy, err := "the cluster is not whole again yet: a node killed, or the old PostgreSQL primary not a standby yet", error(nil)
		if h.restoring.Load() == 0 {
			if !tailRead {
				err = h.readTail(ctx)
				tailRead = err == nil
			}
			if err == nil {
				busy, err = h.busy(ctx, h.tail)
			}
		}
		switch {
		case err != nil:
			state, stable = err.Error(), 0
		case busy != "":
			state, stable = busy, 0
		default:
			stable++
		}
		if stable == 2 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not settled: %s", state)
		case <-time.After(time.Second):
		}
	}
}

// readTail reads the orders stream's last offset into h.tail, within
// streamCallTimeout.
func (h *harness) readTail(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, streamCallTimeout)
	defer cancel()
	env, err := streamio.Open(ctx, streamio.Config{URI: h.cfg.streamURL, Logger: h.quiet})
	if err != nil {
		return err
	}
	defer env.Close()
	last, ok, err := env.Tail(ctx, h.stream)
	if err != nil {
		return err
	}
	if ok {
		h.tail = last
	}
	return nil
}

// busy says what is still going on, or "" when nothing is.
func (h *harness) busy(ctx context.Context, tail int64) (string, error) {
	if h.retaining.Load() > 0 {
		return "a retention fault is still going through the doors", nil
	}
	for _, ex := range h.cfg.examples {
		if p := h.workers[ex]; p.pid() == 0 {
			return p.name + " worker is not running", nil
		}
	}
	for _, ex := range h.queueExamples() {
		for _, q := range []string{h.queue(ex), h.queue(ex) + ".retry"} {
			n, err := queueDepth(ctx, h.cfg.amqpURLs, q)
			if err != nil {
				return "", err
			}
			if n > 0 {
				return fmt.Sprintf("%d messages ready in %s", n, q), nil
			}
		}
	}
	if h.cfg.runs(orders) {
		off, err := h.db.checkpoint(ctx, h.stream)
		if err != nil {
			return "", err
		}
		if off < tail {
			return fmt.Sprintf("orders checkpoint at offset %d, stream tail at %d", off, tail), nil
		}
	}
	for _, ex := range []example{payments, orders} {
		if !h.cfg.runs(ex) {
			continue
		}
		n, err := h.db.openEffects(ctx, ex)
		if err != nil {
			return "", err
		}
		if n > 0 {
			return fmt.Sprintf("%d %s effects pending, in flight or waiting for a retry", n, ex), nil
		}
	}
	qs, err := h.queueStates(ctx)
	if err != nil {
		return "", err
	}
	for _, ex := range h.queueExamples() {
		for _, name := range []string{h.queue(ex), h.queue(ex) + ".retry"} {
			if s := qs[name]; s.Messages > 0 || s.Unacked > 0 {
				return fmt.Sprintf("%s holds %d messages, %d unacknowledged", name, s.Messages, s.Unacked), nil
			}
		}
	}
	return "", nil
}

// queueState is a queue's depth as rabbitmqctl reports it.
type queueState struct {
	Name     string `json:"name"`
	Messages int    `json:"messages"`
	Unacked  int    `json:"messages_unacknowledged"`
}

// queueStates lists this run's queues with rabbitmqctl: ready and
// unacknowledged messages (AMQP's passive declare counts ready ones only).
func (h *harness) queueStates(ctx context.Context) (map[string]queueState, error) {
	out, err := h.rabbitmqctl(ctx, "list_queues", "name", "messages", "messages_unacknowledged", "--formatter=json", "-q")
	if err != nil {
		return nil, err
	}
	var qs []queueState
	if err := json.Unmarshal(out, &qs); err != nil {
		return nil, fmt.Errorf("rabbitmqctl list_queues: %w", err)
	}
	res := map[string]queueState{}
	prefix := "soak." + h.run + "."
	for _, q := range qs {
		if strings.HasPrefix(q.Name, prefix) {
			res[q.Name] = q
		}
	}
	return res, nil
}

// closeAMQP closes, through the broker, the AMQP connections named idem:*
// whose client port is in ports, and returns how many it closed.
func (h *harness) closeAMQP(ctx context.Context, ports map[int]bool) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	out, err := h.rabbitmqctl(ctx, "list_connections", "pid", "peer_port", "client_properties", "-q", "--no-table-headers")
	if err != nil {
		return 0, err
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 {
			continue
		}
		port, err := strconv.Atoi(f[1])
		if err == nil && ports[port] && strings.Contains(f[2], `{"connection_name","idem:`) {
			pids = append(pids, f[0])
		}
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		closed int
		errs   []string
	)
	for _, pid := range pids {
		wg.Go(func() {
			_, err := h.rabbitmqctl(ctx, "close_connection", pid, "idem soak: connections fault")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			closed++
		})
	}
	wg.Wait()
	if len(errs) > 0 && closed == 0 {
		return 0, fmt.Errorf("close connections: %s", strings.Join(errs, "; "))
	}
	return closed, nil
}

// rabbitmqctl runs rabbitmqctl with args, trying again twice: listing
// commands fail now and then on connections that are being set up. With
// the cluster faults it runs on a node that is up, through
// scripts/cluster.sh.
func (h *harness) rabbitmqctl(ctx context.Context, args ...string) ([]byte, error) {
	var lastErr error
	for range 3 {
		ctl := h.cfg.rabbitmqctl
		if h.cluster != nil {
			ctl = h.cluster.ctl()
		}
		cmd := exec.CommandContext(ctx, ctl[0], append(ctl[1:], args...)...)
		// Through scripts/cluster.sh, rabbitmqctl is a grandchild that may
		// hold stdout after its parent was killed.
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.Output()
		if err == nil {
			return out, nil
		}
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		lastErr = fmt.Errorf("rabbitmqctl %s: %w: %s", args[0], err, stderr)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}
