// Package inflight keeps the calls a process waits on (the runtime's own
// database statements), so that a health check can see one that goes
// unanswered while the call itself still waits for its timeout.
package inflight

import (
	"sync"
	"time"
)

// Calls is the set of calls in flight. The zero value is ready to use; it
// is safe for concurrent use.
type Calls struct {
	mu    sync.Mutex
	calls map[*call]struct{}
}

// call is one call in flight.
type call struct {
	began time.Time
	due   time.Time // began, plus the wait the call may take before its answer
}

// Begin records a call that may take wait (a lock wait, say) before it is
// answered; the returned function records its answer, or its end.
func (c *Calls) Begin(wait time.Duration) (answered func()) {
	now := time.Now()
	k := &call{began: now, due: now.Add(wait)}
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[*call]struct{}{}
	}
	c.calls[k] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.calls, k)
		c.mu.Unlock()
	}
}

// Late reports how long the oldest call in flight has waited, and whether
// one has waited longer than its own wait plus limit.
func (c *Calls) Late(limit time.Duration) (oldest time.Duration, late bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.calls {
		oldest = max(oldest, now.Sub(k.began))
		late = late || now.Sub(k.due) > limit
	}
	return oldest, late
}
