package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/store"
)

// lockStream takes the live consumer's stream lock for the whole rebuild,
// so that live reading pauses. Without Options.Wait it fails with
// ErrLiveWorker while a live worker holds the lock.
func (r *runner) lockStream(ctx context.Context) (*pglock.Lock, error) {
	key := store.StreamLockKey(r.tables, r.cfg.Name, r.o.Stream)
	cfg := pglock.Config{Logger: r.log, PollInterval: 250 * time.Millisecond}
	if r.o.Wait {
		r.log.Info("waiting for the live workers to release the stream lock", "lock_key", key)
		lock, err := pglock.Acquire(ctx, r.pool, key, cfg)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		return lock, nil
	}
	lock, err := pglock.TryAcquire(ctx, r.pool, key, cfg)
	if errors.Is(err, pglock.ErrHeld) {
		return nil, fmt.Errorf("%w (%s): stop the live workers of %s, or wait for them with --wait", ErrLiveWorker, key, r.cfg.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return lock, nil
}
