package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// drainTimeout bounds a drain.
const drainTimeout = 5 * time.Minute

// drainResult is one throughput drain.
type drainResult struct {
	mode       string
	round      int
	n          int
	from       time.Time     // the clock's start: the first event applied, or the lease settled if later
	counted    int           // events applied from then on
	window     time.Duration // from → the last event applied
	once       int           // events applied exactly once
	applied    int           // applied rows, duplicates included (must be n)
	violations int           // events applied out of their account's order
	perLabel   map[string]int
	workerCPU  time.Duration // user + system of the worker processes
	stats      workerStats   // summed over the worker processes
}

func (d drainResult) rate() float64 { return float64(d.counted) / d.window.Seconds() }

// workerMicros is the worker processes' CPU per event, in core-µs.
func (d drainResult) workerMicros() float64 { return d.workerCPU.Seconds() * 1e6 / float64(d.n) }

// drain publishes the events to a fresh consumer of mode, starts its worker
// processes, waits until every event is applied and the queues are empty,
// stops the workers, and checks what they applied.
func (b *bench) drain(ctx context.Context, mode string, round int) (drainResult, error) {
	d := drainResult{mode: mode, round: round, n: b.o.n}
	parts, procs := 0, 1
	if strings.HasPrefix(mode, "parts-") {
		parts = b.o.partitions
	}
	if strings.HasSuffix(mode, "-n") {
		procs = b.o.procs
	}
	q := fmt.Sprintf("bench.partitions.%s.%s.r%d", b.runID, mode, round)
	t, err := b.declare(ctx, q, parts)
	if err != nil {
		return d, err
	}
	defer t.remove()
	if err := b.resetTables(ctx); err != nil {
		return d, err
	}
	p, err := newPublisher(b.o, t)
	if err != nil {
		return d, err
	}
	defer p.close()
	if err := p.publishAll(ctx, newEvents(b.o, 1)); err != nil {
		return d, err
	}
	ws, err := b.startWorkers(q, parts, procs)
	if err != nil {
		return d, err
	}
	defer ws.kill()
	if parts > 0 {
		if d.from, err = b.waitSettled(ctx, ws.labels, parts); err != nil {
			return d, err
		}
	}
	if err := b.waitApplied(ctx, b.o.n, t); err != nil {
		return d, err
	}
	if d.workerCPU, d.stats, err = ws.stop(); err != nil {
		return d, err
	}
	return d, b.check(ctx, &d)
}

// waitSettled polls until the lease has spread the partitions: the worker
// processes' sessions hold parts exclusive advisory locks between them,
// each its share (the member lock is shared; a batch's lock is shared but
// for a moment), and returns when.
func (b *bench) waitSettled(ctx context.Context, labels []string, parts int) (time.Time, error) {
	deadline := time.Now().Add(time.Minute)
	low, high := parts/len(labels), (parts+len(labels)-1)/len(labels)
	for {
		rows, err := b.pool.Query(ctx, `SELECT a.application_name, count(*)::int
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted AND starts_with(a.application_name, $1)
			GROUP BY 1`, appName(b.tables.Schema, ""))
		if err != nil {
			return time.Time{}, err
		}
		held, total, even := 0, 0, true
		var name string
		var k int
		_, err = pgx.ForEachRow(rows, []any{&name, &k}, func() error {
			held, total, even = held+1, total+k, even && k >= low && k <= high
			return nil
		})
		if err != nil {
			return time.Time{}, err
		}
		if held == len(labels) && total == parts && even {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("partitions not spread over %d processes after a minute", len(labels))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check reads what the drain applied: the window, the events applied once,
// the violations and each process's share.
func (b *bench) check(ctx context.Context, d *drainResult) error {
	s := b.tables.QuotedSchema()
	var first, last time.Time
	err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id), min(at), max(at) FROM `+s+`.applied`).
		Scan(&d.applied, &d.once, &first, &last)
	if err != nil {
		return err
	}
	if d.from.Before(first) {
		d.from = first
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.applied WHERE at >= $1`, d.from).Scan(&d.counted); err != nil {
		return err
	}
	d.window = last.Sub(d.from)
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.violations`).Scan(&d.violations); err != nil {
		return err
	}
	rows, err := b.pool.Query(ctx, `SELECT label, count(*)::int FROM `+s+`.applied GROUP BY label`)
	if err != nil {
		return err
	}
	d.perLabel = map[string]int{}
	var label string
	var k int
	_, err = pgx.ForEachRow(rows, []any{&label, &k}, func() error { d.perLabel[label] = k; return nil })
	return err
}

// waitApplied polls until n events are applied and the consumer's queues
// hold no ready message (the duplicates published after the last new event
// were delivered too).
func (b *bench) waitApplied(ctx context.Context, n int, t *topology) error {
	deadline := time.Now().Add(drainTimeout)
	for {
		var got int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.tables.QuotedSchema()+`.applied`).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			ready, err := t.ready()
			if err != nil {
				return err
			}
			if ready == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d events applied after %v", got, n, drainTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// workers are the worker processes of one consumer.
type workers struct {
	cmds   []*exec.Cmd
	labels []string
	out    []*strings.Builder
}

// startWorkers starts procs worker processes of the consumer q, labelled
// w1, w2, …
func (b *bench) startWorkers(q string, parts, procs int) (*workers, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ws := &workers{}
	for i := range procs {
		label := fmt.Sprintf("w%d", i+1)
		args := []string{"-child", q, "-child-partitions", fmt.Sprint(parts), "-label", label, "-schema", b.tables.Schema}
		if b.o.deferred {
			args = append(args, "-defer")
		}
		if b.o.cpuprofile != "" {
			args = append(args, "-cpuprofile", b.o.cpuprofile)
		}
		cmd := exec.Command(self, args...)
		cmd.Stderr = os.Stderr
		out := &strings.Builder{}
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			ws.kill()
			return nil, err
		}
		ws.cmds = append(ws.cmds, cmd)
		ws.labels = append(ws.labels, label)
		ws.out = append(ws.out, out)
	}
	return ws, nil
}

// stop ends the processes still running with SIGTERM (they finish their
// batches), waits for them and returns their CPU and their counters.
func (ws *workers) stop() (time.Duration, workerStats, error) {
	var sum workerStats
	var cpu time.Duration
	for _, c := range ws.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
	}
	var firstErr error
	for i, c := range ws.cmds {
		if c.ProcessState == nil {
			if err := c.Wait(); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("worker %s: %w", ws.labels[i], err)
			}
		}
		cpu += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
		s := bufio.NewScanner(strings.NewReader(ws.out[i].String()))
		for s.Scan() {
			var w workerStats
			if json.Unmarshal(s.Bytes(), &w) == nil {
				sum.Processed += w.Processed
				sum.Duplicates += w.Duplicates
				sum.DeadLettered += w.DeadLettered
				sum.Retried += w.Retried
				sum.Batches += w.Batches
			}
		}
	}
	return cpu, sum, firstErr
}

// kill ends every process still running with SIGKILL (after an error).
func (ws *workers) kill() {
	for _, c := range ws.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
}
