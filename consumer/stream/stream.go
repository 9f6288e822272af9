package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/seam"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
)

// errLockLost ends a reading session whose advisory lock went away.
var errLockLost = errors.New("stream: lost the stream lock")

// reader is one Run call.
type reader struct {
	cfg consumer.Config
	c   seam.Consumer
	env *streamio.Env
	// gate orders the batches with a rebuild's swap (store.SwapGate).
	gate int64
}

// Run consumes c's Config.Stream until ctx is cancelled. Only the process
// holding the stream's advisory lock reads; the others wait for it. On
// cancellation the batch in progress commits (bounded by ShutdownTimeout)
// and Run returns nil. Reading that fails (a lost connection, a lost lock)
// resumes from the checkpoint after a backoff.
func Run(ctx context.Context, c *consumer.Consumer) error {
	cfg := c.Config()
	if cfg.Stream == "" {
		return fmt.Errorf("%w: stream.Run needs Config.Stream", consumer.ErrConfig)
	}
	sc, _ := seam.Of(c)
	stopped := sc.Engine.Started(ctx)
	err := run(ctx, cfg, sc)
	stopped(err)
	return err
}

func run(ctx context.Context, cfg consumer.Config, sc seam.Consumer) error {
	uri, err := URL(cfg)
	if err != nil {
		return err
	}
	env, err := streamio.Open(ctx, streamio.Config{URI: uri, Logger: cfg.Logger})
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	defer env.Close()
	r := &reader{cfg: cfg, c: sc, env: env, gate: store.SwapGate(cfg.Tables, cfg.Name, cfg.Stream)}
	return r.run(ctx)
}

// URL is the stream protocol URL of cfg: StreamURL, else IDEM_STREAM_URL,
// else derived from AMQPURL (same credentials, host and vhost, port 5552).
func URL(cfg consumer.Config) (string, error) {
	switch {
	case cfg.StreamURL != "":
		return cfg.StreamURL, nil
	case os.Getenv("IDEM_STREAM_URL") != "" || cfg.AMQPURL == "":
		return streamio.URLFromEnv(), nil
	default:
		return streamio.StreamURL(cfg.AMQPURL)
	}
}

func (r *reader) run(ctx context.Context) error {
	work, stopWork := engine.ShutdownContext(ctx, r.cfg.ShutdownTimeout)
	defer stopWork()
	stopLag := r.watchLag(ctx)
	defer stopLag()
	eng := r.c.Engine
	vitals := &eng.Vitals
	log := r.cfg.Logger.With("consumer", r.cfg.Name, "stream", r.cfg.Stream)
	key := store.StreamLockKey(r.cfg.Tables, r.cfg.Name, r.cfg.Stream)
	for failures := 0; ; {
		log.Info("waiting to become the active stream reader")
		vitals.Connected.Store(true) // a hot standby is ready to take over
		lock, err := pglock.Acquire(ctx, r.cfg.Pool, key, pglock.Config{Logger: r.cfg.Logger})
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			log.Info("active stream reader")
			committed, started := eng.Counts.Batches.Load(), time.Now()
			err = r.follow(ctx, work, lock)
			_ = lock.Release(context.WithoutCancel(ctx))
			if ctx.Err() != nil {
				log.Info("stream reader stopped: shutdown")
				return nil
			}
			if sessionWorked(eng.Counts.Batches.Load() > committed, time.Since(started)) {
				failures = 0 // back off from scratch
			}
		}
		vitals.Connected.Store(false)
		if errors.Is(err, streamio.ErrAccessRefused) {
			log.Error("the broker refused the stream reader; not retrying", "error", err)
			return fmt.Errorf("stream: %w", err)
		}
		failures++
		delay := retry.Backoff(failures, 100*time.Millisecond, r.cfg.ReconnectMaxDelay)
		vitals.SetTrouble(fmt.Sprintf("stream reading stopped: %v", err))
		log.Warn("stream reading stopped, resuming from the checkpoint", "error", err, "retry_in", delay)
		eng.Telemetry().Reconnect(ctx)
		eng.Counts.Reconnects.Add(1)
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
}

// sessionWorked reports whether a reading session did some good: it
// committed a batch, or it lasted retry.Steady (a quiet stream). The restart
// after it then waits as after a first failure; after a session that did
// neither, the delay keeps doubling towards ReconnectMaxDelay.
func sessionWorked(committed bool, lived time.Duration) bool {
	return committed || lived >= retry.Steady
}

// follow reads from after the checkpoint until ctx ends, the lock is lost,
// or reading fails.
func (r *reader) follow(ctx, work context.Context, lock *pglock.Lock) error {
	last, ok, err := store.Checkpoint(ctx, r.cfg.Pool, r.cfg.Tables, r.cfg.Name, r.cfg.Stream)
	if err != nil {
		return err
	}
	from := int64(0)
	if ok {
		from = last + 1
	}
	r.c.Lag.Checkpoint.Store(from - 1)
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // owned: ends with fctx, which follow cancels on return
		select {
		case <-lock.Lost():
			cancel(errLockLost)
		case <-fctx.Done():
		}
	}()
	err = r.env.Follow(fctx, r.cfg.Stream, from, r.cfg.BatchMaxSize, func(_ context.Context, recs []streamio.Record) error {
		return r.batch(fctx, work, recs)
	})
	if cause := context.Cause(fctx); errors.Is(cause, errLockLost) {
		return errLockLost
	}
	return err
}

// batch runs one batch of consecutive records in order (engine.RunOrdered),
// writing the checkpoint in each transaction. Each transaction begins by
// taking the swap gate in shared mode: a rebuild swapping the projection's
// tables in waits for it, and the next batch waits for the swap, so that
// it writes to the new tables, after the rebuild's last message.
func (r *reader) batch(ctx, work context.Context, recs []streamio.Record) error {
	items := r.c.Prepare(streamio.Raws(r.cfg.Stream, recs, time.Now()))
	err := r.c.Engine.RunOrdered(ctx, work, items, engine.Ordered{
		Options:        engine.Options{Gate: r.gate},
		RetryBaseDelay: r.cfg.RetryBaseDelay, RetryMaxDelay: r.cfg.RetryMaxDelay,
		Checkpoint: func(ctx context.Context, tx pgx.Tx, upTo int64) error {
			return store.AdvanceCheckpoint(ctx, tx, r.cfg.Tables, r.cfg.Name, r.cfg.Stream, upTo)
		},
	})
	if err == nil {
		r.c.Lag.Checkpoint.Store(recs[len(recs)-1].Offset)
	}
	return err
}

// watchLag samples the stream's tail every 10s for the lag metric (tail
// offset − checkpoint). The returned stop waits for the sampler.
func (r *reader) watchLag(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if tail, ok, err := r.env.Tail(ctx, r.cfg.Stream); err == nil && ok {
				r.c.Lag.Tail.Store(tail)
			}
			if !retry.Sleep(ctx, 10*time.Second) {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
