package engine

import (
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
}

// SetTrouble records why the source is not connected ("" clears it).
func (v *Vitals) SetTrouble(why string) { v.Trouble.Store(&why) }

// moved records that an attempt made progress.
func (v *Vitals) moved() { v.progress.Store(time.Now().UnixNano()) }

// Stalled reports how long attempts in flight have made no progress, when
// that is longer than limit: the engine is wedged.
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
