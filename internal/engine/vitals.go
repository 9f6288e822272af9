package engine

import (
	"context"
	"sync/atomic"
	"time"
)

// Vitals is what a consumer's health report reads. The source sets whether
// it runs and is connected; the engine records its progress.
type Vitals struct {
	// Running reports that the source's Run is running.
	Running atomic.Bool
	// Connected reports that the source is connected and consuming (a
	// queue), or reading or standing by (a stream).
	Connected atomic.Bool
	// Trouble says why the source is not connected, when it knows.
	Trouble atomic.Pointer[string]
	// Stopped says why Run returned with an error.
	Stopped atomic.Pointer[string]

	active   atomic.Int64 // attempts in flight
	progress atomic.Int64 // when an attempt last moved (Unix ns)
	// failing is when the transactions of the current streak of failed
	// attempts began failing (Unix ns), 0 when the last one committed;
	// failure is the last one's error.
	failing atomic.Int64
	failure atomic.Pointer[string]
}

// Failing reports how long the transactions of the attempts have failed
// without one committing, when that is longer than limit, and the last
// failure: the database is away, read-only, or refuses the batches.
func (v *Vitals) Failing(limit time.Duration) (time.Duration, string, bool) {
	since := v.failing.Load()
	if since == 0 {
		return 0, "", false
	}
	d := time.Since(time.Unix(0, since))
	why := ""
	if p := v.failure.Load(); p != nil {
		why = *p
	}
	return d, why, d > limit
}

// SetTrouble records why the source is not connected ("" clears it).
func (v *Vitals) SetTrouble(why string) { v.Trouble.Store(&why) }

// Stalled reports how long attempts in flight have made no progress, when
// that is longer than limit: the engine is wedged, or every attempt fails.
func (v *Vitals) Stalled(limit time.Duration) (time.Duration, bool) {
	if v.active.Load() == 0 {
		return 0, false
	}
	d := time.Since(time.Unix(0, v.progress.Load()))
	return d, d > limit
}

// StallLimit is how long attempts may go without progress before the
// engine counts as wedged: longer than any one handler may run (its
// timeout, then the grace before it is abandoned) plus a commit.
func (e *Engine) StallLimit() time.Duration {
	return e.cfg.HandlerTimeout + abandonGrace + e.cfg.CommitTimeout + 5*time.Second
}

// Started marks the source running and probes the database (Engine.DB)
// until the returned function is called, with the source's final error,
// when the source's Run returns.
func (e *Engine) Started(ctx context.Context) (stopped func(err error)) {
	e.Vitals.Running.Store(true)
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { // owned by the source's Run: stopped below
		defer close(done)
		e.DB.Run(pctx)
	}()
	return func(err error) {
		cancel()
		<-done
		e.Vitals.Running.Store(false)
		if err != nil {
			why := err.Error()
			e.Vitals.Stopped.Store(&why)
		}
	}
}

// FailingLimit is how long the batch transactions may fail one after
// another before the consumer reports itself not ready: long enough for a
// lock conflict or a failover to resolve, short enough for a load balancer
// or an operator to see a worker that cannot write.
const FailingLimit = 10 * time.Second
