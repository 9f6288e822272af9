package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/pglock"
)

// lockHeldSQL reports whether a session holds the advisory lock whose
// bigint key is split into classid (high 32 bits) and objid (low 32 bits).
const lockHeldSQL = `SELECT EXISTS (SELECT 1 FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid::bigint = $1 AND objid::bigint = $2)`

// lockGrace bounds how long a rebuild without Wait tries the lock when the
// live worker's standby polling races it.
const lockGrace = 3 * time.Second

// lockStream takes the live consumer's stream lock for the whole rebuild,
// so that live reading pauses. Without Options.Wait it fails with
// ErrLiveWorker while a live worker holds the lock.
func (r *runner) lockStream(ctx context.Context) (*pglock.Lock, error) {
	key := r.c.StreamLockKey()
	cfg := pglock.Config{Logger: r.log, PollInterval: 250 * time.Millisecond}
	if r.o.Wait {
		r.log.Info("waiting for the live workers to release the stream lock", "lock_key", key)
		lock, err := pglock.Acquire(ctx, r.pool, key, cfg)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		return lock, nil
	}
	id := uint64(pglock.Key(key))
	var held bool
	if err := r.pool.QueryRow(ctx, lockHeldSQL, int64(id>>32), int64(id&0xffffffff)).Scan(&held); err != nil {
		return nil, fmt.Errorf("replay: check the stream lock: %w", err)
	}
	if held {
		return nil, fmt.Errorf("%w (%s): stop the live workers of %s, or wait for them with --wait", ErrLiveWorker, key, r.cfg.Name)
	}
	actx, cancel := context.WithTimeout(ctx, lockGrace)
	defer cancel()
	lock, err := pglock.Acquire(actx, r.pool, key, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("replay: %w", ctx.Err())
		}
		return nil, fmt.Errorf("%w (%s): stop the live workers of %s, or wait for them with --wait", ErrLiveWorker, key, r.cfg.Name)
	}
	return lock, nil
}
