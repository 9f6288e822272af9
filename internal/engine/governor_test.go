package engine

import (
	"context"
	"testing"
	"time"
)

func TestGovernorHalvesOnContentionAndRecoversAfterARunOfCleanBatches(t *testing.T) {
	g := newGovernor(8)
	g.done(false, true, false, false)
	g.done(false, true, false, false)
	if g.limit != 2 {
		t.Fatalf("limit %d after two conflicts, want 2", g.limit)
	}
	for range 2 {
		g.done(false, false, false, false)
	}
	if g.limit != 3 {
		t.Fatalf("limit %d after a clean run, want 3", g.limit)
	}
}

func TestGovernorSerializesAcrossProcessesWhenASoloBatchConflictsAndProbesLater(t *testing.T) {
	g := newGovernor(1)
	ctx := context.Background()
	serial, solo, ok := g.admit(ctx, nil)
	if !ok || serial || !solo {
		t.Fatalf("first batch: serial %v solo %v ok %v", serial, solo, ok)
	}
	g.done(true, true, serial, solo) // alone in this process, yet it conflicted: another process
	serial, _, _ = g.admit(ctx, nil)
	if !serial {
		t.Fatal("after a solo conflict, batches must take the consumer's lock")
	}
	g.done(true, false, true, true)
	g.mu.Lock()
	g.serialUntil = time.Now().Add(-time.Millisecond) // the probe is due
	g.mu.Unlock()
	serial, _, _ = g.admit(ctx, nil)
	if serial {
		t.Fatal("the due probe must run without the lock")
	}
	g.done(true, true, false, true) // the probe conflicted: stay serialized
	if g.serialUntil.IsZero() {
		t.Fatal("a conflicting probe must keep batches serialized")
	}
	g.mu.Lock()
	g.serialUntil = time.Now().Add(-time.Millisecond)
	g.mu.Unlock()
	serial, _, _ = g.admit(ctx, nil)
	g.done(true, false, serial, true) // a clean probe
	if !g.serialUntil.IsZero() {
		t.Fatal("a clean probe must end the serialization")
	}
}

func TestExclusiveRunWaitsForRunningBatchesAndHoldsNewOnesBack(t *testing.T) {
	g := newGovernor(4)
	ctx := context.Background()
	g.admit(ctx, nil)
	got := make(chan func(), 1)
	go func() {
		r, ok := g.exclusive(ctx, nil)
		if ok {
			got <- r
		}
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("ran alone while a batch was running")
	default:
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, _, ok := g.admit(short, nil); ok {
		t.Fatal("a new batch was admitted while a suspect waited to run alone")
	}
	g.done(true, false, false, false)
	select {
	case r := <-got:
		r()
	case <-time.After(5 * time.Second):
		t.Fatal("the exclusive run never started")
	}
}

// Batches that serialize again soon after a probe went through (the probe
// met no conflict because the other processes were serialized) probe less
// and less often while the contention lasts.
func TestGovernorProbesLessOftenWhileContentionLasts(t *testing.T) {
	g := newGovernor(1)
	g.done(false, true, false, true) // a conflict with another process
	first := g.probeAfter
	if first != minProbeAfter {
		t.Fatalf("first serialization probes after %s, want %s", first, minProbeAfter)
	}
	g.mu.Lock()
	g.serialUntil = time.Now().Add(-time.Millisecond)
	g.mu.Unlock()
	serial, _, _ := g.admit(context.Background(), nil)
	g.done(true, false, serial, true) // the probe went through
	g.done(false, true, false, true)  // and batches conflict again at once
	if g.probeAfter != 2*first {
		t.Fatalf("probe after %s, want %s", g.probeAfter, 2*first)
	}
}
