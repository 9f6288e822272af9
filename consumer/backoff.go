package consumer

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff returns the delay before attempt n (1-based): base doubled n-1
// times, capped at limit, with "equal jitter" (half fixed, half random) so
// that retries of a burst spread out but never come back early.
func backoff(n int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	half := d / 2
	return half + rand.N(half+1)
}

// sleep waits for d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
