package engine

import (
	"context"
	"sync"
	"time"
)

// ShutdownContext returns a context for in-flight work: it ignores ctx's
// cancellation for grace, then is cancelled too. Sources run their batches
// on it, so that a batch already started when Run's context ends may still
// commit and settle. stop releases its timer.
func ShutdownContext(ctx context.Context, grace time.Duration) (work context.Context, stop func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(grace, cancel)
		mu.Unlock()
	})
	return work, func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
