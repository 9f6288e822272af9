package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// governor admits batches. Up to limit run at once: limit halves when
// batches contend for rows (each conflict is a retry) and grows by one after
// a run of limit batches without contention, up to MaxConcurrency, so that
// concurrency backs off only as much as contention demands and recovers in
// a few batches.
//
// Contention that goes on while only one batch runs in this process comes
// from other processes with the same consumer: the governor then serializes
// its batches across processes too — each takes a transaction-scoped
// advisory lock of the consumer first, so batches of every process queue on
// it instead of timing out on each other's rows — and after a while it
// tries a batch without it, staying serialized if that one conflicts.
//
// A suspect message runs alone: no batch is admitted while it waits for the
// running ones to finish, or while it runs.
type governor struct {
	mu      sync.Mutex
	max     int
	limit   int
	running int
	alone   bool // a suspect runs
	waiting int  // suspects waiting to run alone
	streak  int  // batches without contention since limit last changed
	// serialUntil, when in the future, serializes batches across processes;
	// at that time one batch probes without the lock.
	serialUntil time.Time
	probing     bool
	// probeAfter is how long batches stay serialized before the next probe:
	// it doubles with each probe that conflicts, and each time batches
	// serialize again soon after a probe went through (the others were
	// serialized, not the contention gone), up to maxProbeAfter.
	probeAfter time.Duration
	// parallelSince is when the last probe went through.
	parallelSince time.Time
	changed       chan struct{}
	// Limit mirrors limit for telemetry and Stats.
	Limit atomic.Int64
}

// How long batches stay serialized across processes before one tries
// without the lock: a probe that conflicts costs a lock timeout and a retry,
// so while contention lasts they come rarer.
const (
	minProbeAfter = 2 * time.Second
	maxProbeAfter = 30 * time.Second
)

func newGovernor(n int) *governor {
	n = max(n, 1)
	g := &governor{max: n, limit: n, changed: make(chan struct{})}
	g.Limit.Store(int64(n))
	return g
}

// wake tells every waiter that something changed; mu must be held.
func (g *governor) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait releases mu until something changes, ctx ends or abandon closes; it
// reports whether to go on, with mu held again.
func (g *governor) wait(ctx context.Context, abandon <-chan struct{}) bool {
	ch := g.changed
	g.mu.Unlock()
	defer g.mu.Lock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	case <-abandon:
		return false
	}
}

// admit waits for a batch's turn; release ends it. serial says the batch
// must take the consumer's advisory lock. ok is false when ctx ended or
// abandon closed first.
func (g *governor) admit(ctx context.Context, abandon <-chan struct{}) (release func(), serial, solo, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.alone || g.waiting > 0 || g.running >= g.limit {
		if !g.wait(ctx, abandon) {
			return nil, false, false, false
		}
	}
	g.running++
	// Alone in this process while it runs: nothing else is running, and
	// nothing else is admitted until it ends.
	solo = g.running == 1 && g.limit == 1
	serial = !g.serialUntil.IsZero()
	if serial && !g.probing && time.Now().After(g.serialUntil) {
		g.probing, serial = true, false // this one tries without the lock
	}
	return g.leave, serial, solo, true
}

func (g *governor) leave() {
	g.mu.Lock()
	g.running--
	g.wake()
	g.mu.Unlock()
}

// exclusive waits until no batch runs and holds the engine alone.
func (g *governor) exclusive(ctx context.Context, abandon <-chan struct{}) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiting++
	for g.alone || g.running > 0 {
		if !g.wait(ctx, abandon) {
			g.waiting--
			g.wake()
			return nil, false
		}
	}
	g.waiting--
	g.alone = true
	return func() {
		g.mu.Lock()
		g.alone = false
		g.wake()
		g.mu.Unlock()
	}, true
}

// done records how a batch transaction ended; serial says whether it held
// the consumer's batch lock exclusively, solo whether a conflict it met was
// with another process (it ran alone in this process, or its row was no
// other batch's here).
func (g *governor) done(contention, serial, solo bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !serial && g.probing {
		g.probing = false
		if contention {
			g.probeAfter = min(2*g.probeAfter, maxProbeAfter)
			g.serialUntil = time.Now().Add(g.probeAfter)
		} else {
			g.serialUntil = time.Time{} // the probe went through: parallel again
			g.parallelSince = time.Now()
		}
	}
	switch {
	case contention && solo && !serial:
		if time.Since(g.parallelSince) < 2*maxProbeAfter {
			g.probeAfter = min(2*max(g.probeAfter, minProbeAfter), maxProbeAfter) // back soon: the contention lasts
		} else {
			g.probeAfter = minProbeAfter
		}
		g.serialUntil = time.Now().Add(g.probeAfter) // conflicts with other processes
		g.streak = 0
	case contention:
		g.limit = max(1, g.limit/2)
		g.streak = 0
	case g.limit < g.max:
		g.streak++
		if g.streak >= g.limit {
			g.limit++
			g.streak = 0
			g.wake()
		}
	}
	g.Limit.Store(int64(g.limit))
}

// countDown decrements a positive counter and reports whether it was positive.
func countDown(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// unprobe ends a probe whose attempt ended without a verdict (a message was
// excluded from it): the next admission probes again.
func (g *governor) unprobe(serial bool) {
	g.mu.Lock()
	if !serial && g.probing {
		g.probing = false
	}
	g.mu.Unlock()
}
