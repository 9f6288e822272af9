// Package retry holds the one backoff policy of the module: capped
// exponential delays with jitter, and a sleep that ends with its context.
// The consumer runtime, the stream source, replays, the ledger dispatcher and
// the CLI all wait between attempts with it.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Steady is how long a connection or session must last to count as one
// that worked even though it did nothing (an idle queue or stream): the
// reconnect after it waits as after a first failure, not as after the
// failures before it.
const Steady = time.Minute

// Backoff returns the delay before attempt n (1-based): base doubled n-1
// times, capped at limit, with "equal jitter" (half fixed, half random), so
// that the retries of a burst spread out but never come back early.
func Backoff(n int, base, limit time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	half := d / 2
	return half + rand.N(half+1)
}

// Jitter returns a random duration in [0, d]: spread for periodic work
// that many processes start at once.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// Sleep waits for d or until ctx is done; it reports whether d elapsed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
