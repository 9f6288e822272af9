// Package pglock elects one active holder of a key across processes with a
// PostgreSQL session-level advisory lock: one active reader per (consumer,
// stream), the other processes waiting as hot standbys.
//
// The holder keeps a dedicated pool connection for as long as it holds the
// lock and pings it; when the connection dies (the process crashed, the
// backend was terminated, the network dropped) PostgreSQL releases the lock,
// Lost closes on the holder, and a standby polling with pg_try_advisory_lock
// takes over within about PollInterval.
//
// The lock avoids wasted work, it does not make work safe: between the loss
// of a session and the holder noticing it (up to HealthInterval plus the
// ping's timeout) two processes may both believe they are active. Whatever
// they write must stay correct under that overlap, as idem's inbox and
// checkpoint transactions are.
package pglock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures Acquire. The zero value is ready to use.
type Config struct {
	// HealthInterval is how often the holder pings its connection. Default:
	// 1s.
	HealthInterval time.Duration
	// HealthTimeout bounds one ping, one attempt at the lock while waiting
	// and the unlock in Release; one that does not answer in time counts as
	// a broken connection. Default: 5s.
	HealthTimeout time.Duration
	// Logger receives the lock's logs. Default: slog.Default().
	Logger *slog.Logger
	// PollInterval is how often a waiting Acquire tries the lock again.
	// Default: 1s.
	PollInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.HealthInterval <= 0 {
		c.HealthInterval = time.Second
	}
	if c.HealthTimeout <= 0 {
		c.HealthTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	return c
}

// namespace keeps idem's keys apart from other users of advisory locks in
// the same database.
const namespace = "idem/pglock\x00"

// Key returns the advisory lock id for key: the first 8 bytes of
// SHA-256("idem/pglock\x00" + key).
func Key(key string) int64 {
	sum := sha256.Sum256([]byte(namespace + key))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

const (
	sqlTryLock = `SELECT pg_try_advisory_lock($1)`
	sqlUnlock  = `SELECT pg_advisory_unlock($1)`
)

// Lock is a held advisory lock. Release it when done.
type Lock struct {
	key    string
	id     int64
	conn   *pgxpool.Conn
	cfg    Config
	lost   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	logger *slog.Logger
}

// Acquire takes the session-level advisory lock for key on a connection it
// acquires from pool and keeps, trying again every PollInterval while another
// session holds it, until it gets it or ctx ends (ctx's error is returned,
// wrapped). A connection that breaks while waiting, or does not answer an
// attempt within HealthTimeout, is replaced.
func Acquire(ctx context.Context, pool *pgxpool.Pool, key string, cfg Config) (*Lock, error) {
	return acquire(ctx, pool, key, cfg, false)
}

// ErrHeld is returned by TryAcquire while another session holds the lock.
var ErrHeld = errors.New("pglock: held by another session")

// TryAcquire takes the lock if it is free and returns ErrHeld at once if
// another session holds it.
func TryAcquire(ctx context.Context, pool *pgxpool.Pool, key string, cfg Config) (*Lock, error) {
	return acquire(ctx, pool, key, cfg, true)
}

func acquire(ctx context.Context, pool *pgxpool.Pool, key string, cfg Config, once bool) (*Lock, error) {
	cfg = cfg.withDefaults()
	id := Key(key)
	logger := cfg.Logger.With(slog.String("lock_key", key), slog.Int64("lock_id", id))
	var conn *pgxpool.Conn
	waiting := false
	for {
		got, err := tryLock(ctx, pool, &conn, id, cfg.HealthTimeout)
		switch {
		case err == nil && got:
			l := &Lock{
				key: key, id: id, conn: conn, cfg: cfg, logger: logger,
				lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
			}
			go l.watch()
			logger.Debug("pglock: acquired", slog.Uint64("pid", uint64(conn.Conn().PgConn().PID())))
			return l, nil
		case errors.Is(err, errNoConn):
			return nil, fmt.Errorf("pglock: acquire %s: %w", key, err)
		case err != nil && ctx.Err() == nil:
			// A broken or frozen connection (or a pool that did not hand
			// one out in time): replace it and keep waiting.
			logger.Warn("pglock: try lock failed, reconnecting", slog.Any("error", err))
			if conn != nil {
				discard(conn)
				conn = nil
			}
		case err == nil && once:
			conn.Release()
			return nil, fmt.Errorf("pglock: acquire %s: %w", key, ErrHeld)
		case err == nil && !waiting:
			waiting = true
			logger.Info("pglock: held elsewhere, waiting as standby")
		}
		t := time.NewTimer(cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			if conn != nil {
				conn.Release()
			}
			return nil, fmt.Errorf("pglock: acquire %s: %w", key, ctx.Err())
		case <-t.C:
		}
	}
}

// errNoConn marks a pool that failed to hand out a connection for a reason
// other than the attempt's timeout; Acquire returns it rather than retrying.
var errNoConn = errors.New("connection")

// tryLock makes one attempt at the lock on *conn, taking a connection from
// pool first when *conn is nil. The whole attempt is bounded by timeout, so
// that a connection that stops answering without breaking (a frozen
// network, a stalled proxy) fails the attempt instead of blocking the
// standby forever; the caller replaces it as it would a broken one.
func tryLock(ctx context.Context, pool *pgxpool.Pool, conn **pgxpool.Conn, id int64, timeout time.Duration) (bool, error) {
	attempt, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if *conn == nil {
		c, err := pool.Acquire(attempt)
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return false, fmt.Errorf("connection: no answer within %s: %w", timeout, err)
			}
			return false, fmt.Errorf("%w: %w", errNoConn, err)
		}
		*conn = c
	}
	var got bool
	if err := (*conn).QueryRow(attempt, sqlTryLock, id).Scan(&got); err != nil {
		if ctx.Err() == nil && attempt.Err() != nil {
			return false, fmt.Errorf("try lock: no answer within %s: %w", timeout, err)
		}
		return false, fmt.Errorf("try lock: %w", err)
	}
	return got, nil
}

// discard closes c's connection so that the pool destroys it on Release.
func discard(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Conn().Close(ctx)
	c.Release()
}

// watch pings the connection every HealthInterval until Release stops it or
// a ping fails. On failure it closes the connection, so that PostgreSQL
// releases the lock whatever state the session was in, and then Lost.
func (l *Lock) watch() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.HealthTimeout)
		err := l.conn.Ping(ctx)
		cancel()
		if err != nil {
			l.logger.Error("pglock: lost", slog.Any("error", err))
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = l.conn.Conn().Close(closeCtx)
			cancel()
			close(l.lost)
			return
		}
	}
}

// Key returns the key the lock was acquired for.
func (l *Lock) Key() string { return l.key }

// Lost is closed when the lock's connection has died, and with it the lock:
// stop the work the lock guards, Release, and Acquire again to become a
// standby.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// ErrReleased is returned (wrapped) by a second Release.
var ErrReleased = errors.New("pglock: lock already released")

// Release stops the health check, unlocks and returns the connection to the
// pool. A lost lock's broken connection is destroyed instead; that is not an
// error. When unlocking fails or does not answer within HealthTimeout the
// connection is closed, which releases the lock server-side, and the error is
// returned.
func (l *Lock) Release(ctx context.Context) error {
	first := false
	l.once.Do(func() { first = true })
	if !first {
		return fmt.Errorf("pglock: release %s: %w", l.key, ErrReleased)
	}
	close(l.stop)
	<-l.done
	select {
	case <-l.lost:
		l.conn.Release()
		return nil
	default:
	}
	// Bounded like a ping: a frozen connection must not hold Release (called
	// with a context without cancellation during shutdown) forever.
	unlockCtx, cancel := context.WithTimeout(ctx, l.cfg.HealthTimeout)
	defer cancel()
	var unlocked bool
	if err := l.conn.QueryRow(unlockCtx, sqlUnlock, l.id).Scan(&unlocked); err != nil {
		discard(l.conn)
		if ctx.Err() == nil && unlockCtx.Err() != nil {
			return fmt.Errorf("pglock: release %s: unlock: no answer within %s, connection closed (the server drops the lock when it notices): %w",
				l.key, l.cfg.HealthTimeout, err)
		}
		return fmt.Errorf("pglock: release %s: unlock: connection closed: %w", l.key, err)
	}
	l.conn.Release()
	if !unlocked {
		return fmt.Errorf("pglock: release %s: the session did not hold the lock", l.key)
	}
	l.logger.Debug("pglock: released")
	return nil
}
