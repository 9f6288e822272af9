package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/streamio"
)

// errLockLost ends a stream session whose advisory lock went away.
var errLockLost = errors.New("consumer: lost the stream lock")

// StreamLockKey is the advisory lock that makes one process the active
// reader of the consumer's stream; the others wait as hot standbys. A
// rebuild replay takes the same lock, so live reading pauses while it runs.
func (c *Consumer) StreamLockKey() string {
	return "idem/stream/" + c.cfg.Tables.Schema + "/" + c.cfg.Name + "/" + c.cfg.Stream
}

// runStream consumes a RabbitMQ stream: in order, batched, with the
// checkpoint written in each batch's transaction. Only the process holding
// the stream's advisory lock reads; the others wait for it.
func (c *Consumer) runStream(ctx context.Context) error {
	env, err := streamio.Open(ctx, streamio.Config{URI: c.cfg.StreamURL, Logger: c.cfg.Logger})
	if err != nil {
		return err
	}
	defer env.Close()
	work, stopWork := shutdownContext(ctx, c.cfg.ShutdownTimeout)
	defer stopWork()

	stopLag := c.watchLag(ctx, env)
	defer stopLag()

	log := c.cfg.Logger.With("consumer", c.cfg.Name, "stream", c.cfg.Stream)
	for failures := 0; ; {
		log.Info("waiting to become the active stream reader")
		lock, err := pglock.Acquire(ctx, c.cfg.Pool, c.StreamLockKey(), pglock.Config{Logger: c.cfg.Logger})
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			log.Info("active stream reader")
			committed := c.counts.batches.Load()
			err = c.followStream(ctx, work, env, lock)
			_ = lock.Release(context.WithoutCancel(ctx))
			if ctx.Err() != nil {
				return nil
			}
			if c.counts.batches.Load() > committed {
				failures = 0 // the session worked: back off from scratch
			}
		}
		failures++
		delay := backoff(failures, 100*time.Millisecond, c.cfg.ReconnectMaxDelay)
		log.Warn("stream reading stopped, resuming from the checkpoint", "error", err, "retry_in", delay)
		c.tel.reconnect(ctx)
		c.counts.reconnects.Add(1)
		if !sleep(ctx, delay) {
			return nil
		}
	}
}

// followStream reads from after the checkpoint until ctx ends, the lock is
// lost, or reading fails.
func (c *Consumer) followStream(ctx, work context.Context, env *streamio.Env, lock *pglock.Lock) error {
	last, ok, err := Checkpoint(ctx, c.cfg.Pool, c.cfg.Tables, c.cfg.Name, c.cfg.Stream)
	if err != nil {
		return err
	}
	from := int64(0)
	if ok {
		from = last + 1
	}
	c.checkpoint.Store(from - 1)
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // owned: ends with fctx, which followStream cancels on return
		select {
		case <-lock.Lost():
			cancel(errLockLost)
		case <-fctx.Done():
		}
	}()
	err = env.Follow(fctx, c.cfg.Stream, from, c.cfg.BatchMaxSize, func(_ context.Context, recs []streamio.Record) error {
		return c.streamBatch(fctx, work, recs)
	})
	if cause := context.Cause(fctx); errors.Is(cause, errLockLost) {
		return errLockLost
	}
	return err
}

// streamBatch runs one batch of consecutive records. A message whose
// handler fails is retried in place (a stream has no retry queue) after a
// backoff, alone, until it succeeds or is dead-lettered with max_attempts.
// The checkpoint written with each transaction never passes a message that
// is not settled: not a retried one, not one of a later half of a split
// batch that has not committed yet. ctx ends when the lock is lost or on
// shutdown; work outlives shutdown for the batch in progress.
func (c *Consumer) streamBatch(ctx, work context.Context, recs []streamio.Record) error {
	ins := make([]Incoming, len(recs))
	for i, r := range recs {
		ins[i] = Incoming{
			MessageID: r.MessageID, Body: r.Body, Headers: r.ApplicationProperties,
			ContentType: r.Properties.ContentType, CorrelationID: r.Properties.CorrelationID,
			Source: c.cfg.Stream, Offset: r.Offset, HasOffset: true, Timestamp: r.Timestamp,
		}
	}
	pending := c.prepareAll(ins)
	last := recs[len(recs)-1].Offset
	settled := make(map[int64]bool, len(recs)) // committed with a final outcome
	final := func(r result) bool {
		return r.outcome != outcomeRetry && r.outcome != outcomeUnresolved && r.outcome != outcomeDeferred
	}
	opts := batchOptions{
		inOrder:     true,
		stopAtRetry: true,
		abandon:     ctx.Done(),
		beforeCommit: func(ctx context.Context, tx pgx.Tx, msgs []*Message, results []result) error {
			now := make(map[int64]bool, len(msgs))
			for i, r := range results {
				if final(r) {
					now[msgs[i].Offset] = true
				}
			}
			upTo := last
			for _, r := range recs {
				if !settled[r.Offset] && !now[r.Offset] {
					upTo = r.Offset - 1
					break
				}
			}
			if upTo < 0 {
				return nil
			}
			return AdvanceCheckpoint(ctx, tx, c.cfg.Tables, c.cfg.Name, c.cfg.Stream, upTo)
		},
		committed: func(msgs []*Message, results []result) {
			for i, r := range results {
				if final(r) {
					settled[msgs[i].Offset] = true
				}
			}
		},
	}
	for attempt := 1; ; attempt++ {
		batch := pending
		results := c.runBatch(work, batch, opts)
		c.counts.count(results)
		pending = pending[:0:0]
		for i, r := range results {
			if r.outcome != outcomeDeferred {
				c.tel.outcome(work, outcomeName(r), 1)
			}
			switch r.outcome {
			case outcomeUnresolved:
				return fmt.Errorf("consumer: batch at offset %d: %w", batch[i].Offset, r.err)
			case outcomeRetry:
				m := batch[i]
				c.cfg.Logger.Info("handler failed, retrying in place", "consumer", c.cfg.Name, "offset", m.Offset,
					"message_id", shortID(m.ID), "attempt", m.Attempt, "error", errorText(r.err))
				m.Attempt++
				pending = append(pending, m)
			case outcomeDeferred:
				pending = append(pending, batch[i]) // its turn comes after the retried one
			case outcomeDeadLettered:
				c.logDeadLetter(batch[i], r)
			}
		}
		if len(pending) == 0 {
			c.checkpoint.Store(last)
			return nil
		}
		if !sleep(ctx, backoff(attempt, c.cfg.RetryBaseDelay, c.cfg.RetryMaxDelay)) {
			return ctx.Err() // shutdown or lost lock: the checkpoint stays before the failing message
		}
	}
}

// watchLag samples the stream's tail every LagInterval for the lag metric
// (tail offset − checkpoint). The returned stop waits for the sampler.
func (c *Consumer) watchLag(ctx context.Context, env *streamio.Env) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if tail, ok, err := env.Tail(ctx, c.cfg.Stream); err == nil && ok {
				c.tail.Store(tail)
			}
			if !sleep(ctx, 10*time.Second) {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
