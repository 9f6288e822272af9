package run

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// StopTimeout is how long All waits for the other parts once the first
// one returned (or ctx ended) before it gives up on them.
const StopTimeout = time.Minute

// ErrStopTimeout is returned, wrapped with the parts that had not returned,
// when parts are still running StopTimeout after they were told to stop.
// Their goroutines are left running; the process should exit.
var ErrStopTimeout = errors.New("run: parts did not stop in time")

// All runs every part on a goroutine of its own, each with a context that
// ends when ctx ends or when any part returns. It returns the first non-nil
// error a part returned (nil if none did) once every part has returned, or
// an error wrapping ErrStopTimeout when some part has not returned
// StopTimeout after the others were told to stop. A nil part is an error
// wrapping idem.ErrConfig, returned before any part starts.
func All(ctx context.Context, parts ...func(context.Context) error) error {
	for i, part := range parts {
		if part == nil {
			return fmt.Errorf("run: %w: part %d is nil", idem.ErrConfig, i+1)
		}
	}
	return all(ctx, StopTimeout, parts)
}

func all(ctx context.Context, stopTimeout time.Duration, parts []func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		first   error
		running = make(map[int]bool, len(parts))
		wg      sync.WaitGroup
	)
	for i := range parts {
		running[i] = true
	}
	for i, part := range parts {
		wg.Go(func() {
			defer cancel()
			err := part(ctx)
			mu.Lock()
			defer mu.Unlock()
			delete(running, i)
			if err != nil && first == nil {
				first = fmt.Errorf("run: part %d: %w", i+1, err)
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			mu.Lock()
			defer mu.Unlock()
			var left []int
			for i := range parts {
				if running[i] {
					left = append(left, i+1)
				}
			}
			return errors.Join(first, fmt.Errorf("%w: parts %v still running %s after the stop", ErrStopTimeout, left, stopTimeout))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}
