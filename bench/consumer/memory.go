package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"
)

// memoryResult is what the memory-measuring child reports on stdout.
type memoryResult struct {
	N        int     `json:"n"`
	Prefetch int     `json:"prefetch"`
	Seconds  float64 `json:"seconds"`
	HWMkB    int64   `json:"vm_hwm_kb"`
	RSSkB    int64   `json:"vm_rss_kb"`
	GoSys    uint64  `json:"go_sys_bytes"`
	HeapSys  uint64  `json:"heap_sys_bytes"`
}

// memory publishes o.n messages, then consumes them with idem in a child
// process (this binary with -child-queue), so that the resident memory it
// reports is the consumer's alone: no publisher, no earlier modes.
func (b *bench) memory(ctx context.Context) (memoryResult, error) {
	var m memoryResult
	q := b.queue("memory")
	c, _, err := b.newIdem(q, "bench-memory", true, false, b.pool)
	if err != nil {
		return m, err
	}
	if err := c.Declare(ctx); err != nil {
		return m, err
	}
	before, err := b.balanceSum(ctx)
	if err != nil {
		return m, err
	}
	if err := b.publish(ctx, q, b.o.n); err != nil {
		return m, err
	}
	exe, err := os.Executable()
	if err != nil {
		return m, err
	}
	cmd := exec.CommandContext(ctx, exe, "-child-queue", q, "-child-schema", b.tables.Schema,
		"-n", strconv.Itoa(b.o.n), "-prefetch", strconv.Itoa(b.o.prefetch),
		"-workers", strconv.Itoa(b.o.workers), "-batch", strconv.Itoa(b.o.batchMaxSize))
	cmd.Env = append(os.Environ(), "IDEM_PG_URL="+b.o.pgURL, "IDEM_AMQP_URL="+b.o.amqpURL)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return m, fmt.Errorf("child: %w", err)
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &m); err != nil {
		return m, fmt.Errorf("child output %q: %w", out, err)
	}
	after, err := b.balanceSum(ctx)
	if err != nil {
		return m, err
	}
	if after-before != int64(b.o.n) {
		return m, fmt.Errorf("balances grew by %d, want %d", after-before, b.o.n)
	}
	return m, nil
}

// runChild is the memory-measuring child: it consumes o.n messages from
// o.child with idem and prints a memoryResult as JSON.
func runChild(ctx context.Context, o options) error {
	pool, err := newPool(ctx, o, "idem-bench-memory")
	if err != nil {
		return err
	}
	defer pool.Close()
	b := newBench(o, "", o.childSchema, pool)
	c, _, err := b.newIdem(o.child, "bench-memory", true, false, pool)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := consumeIdem(ctx, c, o.n); err != nil {
		return err
	}
	m := memoryResult{N: o.n, Prefetch: o.prefetch, Seconds: time.Since(start).Seconds()}
	m.HWMkB, m.RSSkB = procStatus()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.GoSys, m.HeapSys = ms.Sys, ms.HeapSys
	return json.NewEncoder(os.Stdout).Encode(m)
}
