package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
)

// Config says which stream a Consumer reads.
type Config struct {
	// Stream is the RabbitMQ stream to read. Required.
	Stream string
	// URL is the stream protocol URL, or the URLs of a cluster's nodes
	// separated by commas: each connection goes to the first of them, in a
	// shuffled order, that answers. Default: IDEM_STREAM_URL, else derived
	// from the consumer's AMQPURL or AMQPURLs (same credentials, hosts and
	// vhost, port 5552), else rabbitmq-stream://guest:guest@127.0.0.1:5552/.
	URL string
}

// Consumer is a consumer.Consumer that reads a stream: in order, with the
// checkpoint in each batch's transaction, one active reader per (Name,
// Stream) across processes. Build it with New; register the handler on the
// consumer.Consumer it wraps (Handle, HandleBatch); run it with Run.
type Consumer struct {
	c      *consumer.Consumer
	eng    *engine.Engine
	stream string
	url    string
}

// New makes c, a consumer built with consumer.New without a Queue, read
// cfg.Stream. It refuses a c whose Config sets fields only a queue reads
// (consumer.Config.QueueOnly): a wrong combination fails here, never in Run.
func New(c *consumer.Consumer, cfg Config) (*Consumer, error) {
	ccfg := c.Config()
	if cfg.Stream == "" {
		return nil, fmt.Errorf("%w: stream.New needs Config.Stream", consumer.ErrConfig)
	}
	if set := ccfg.QueueOnly(); len(set) > 0 {
		return nil, fmt.Errorf("%w: a stream consumer reads no queue; leave %s unset (queue only)", consumer.ErrConfig,
			strings.Join(set, ", "))
	}
	var amqpURLs []string
	if ccfg.AMQPURL != "" {
		amqpURLs = []string{ccfg.AMQPURL}
	}
	url, err := resolveURL(cfg.URL, append(amqpURLs, ccfg.AMQPURLs...))
	if err != nil {
		return nil, err
	}
	eng := c.Engine(engine.ModuleKey())
	eng.SetSource(cfg.Stream)
	return &Consumer{c: c, eng: eng, stream: cfg.Stream, url: url}, nil
}

// Consumer returns the consumer.Consumer s reads for: its Config, Health,
// Stats, Process.
func (s *Consumer) Consumer() *consumer.Consumer { return s.c }

// Stream is the stream s reads.
func (s *Consumer) Stream() string { return s.stream }

// URL is the stream protocol URL s reads from (several, comma-separated,
// for a cluster).
func (s *Consumer) URL() string { return s.url }

// Engine gives the module's replay package the consumer's runtime. Only
// idem's own packages can make its argument (engine.ModuleKey); it panics
// with any other.
func (s *Consumer) Engine(k engine.Key) *engine.Engine {
	k.Check()
	return s.eng
}

// Run reads s's stream until ctx is cancelled (see Consumer.Run).
func Run(ctx context.Context, s *Consumer) error { return s.Run(ctx) }

// Run reads the stream until ctx is cancelled. Only the process holding the
// stream's advisory lock reads; the others wait for it. On cancellation the
// batch in progress commits (bounded by ShutdownTimeout) and Run returns
// nil. Reading that fails (a lost connection, a lost lock) resumes from the
// checkpoint after a backoff.
func (s *Consumer) Run(ctx context.Context) error {
	cfg := s.c.Config()
	if s.eng.Config().Handler == nil {
		return fmt.Errorf("%w: no handler: call Handle before Run", consumer.ErrConfig)
	}
	stopped := s.eng.Started(ctx)
	env, err := streamio.Open(ctx, streamio.Config{URI: s.url, Logger: cfg.Logger})
	if err != nil {
		err = fmt.Errorf("stream: %w", err)
		stopped(err)
		return err
	}
	r := &reader{cfg: cfg, stream: s.stream, eng: s.eng, env: env, gate: store.SwapGate(cfg.Tables, cfg.Name, s.stream)}
	err = r.run(ctx)
	env.Close()
	stopped(err)
	return err
}

// resolveURL is the stream protocol URL: url, else IDEM_STREAM_URL, else
// derived from amqpURLs.
func resolveURL(url string, amqpURLs []string) (string, error) {
	switch {
	case url != "":
		return url, nil
	case os.Getenv("IDEM_STREAM_URL") != "" || len(amqpURLs) == 0:
		return streamio.URLFromEnv(), nil
	default:
		return streamio.StreamURLs(amqpURLs)
	}
}

// errLockLost ends a reading session whose advisory lock went away.
var errLockLost = errors.New("stream: lost the stream lock")

// reader is one Run call.
type reader struct {
	cfg    consumer.Config
	stream string
	eng    *engine.Engine
	env    *streamio.Env
	// gate orders the batches with a rebuild's swap (store.SwapGate).
	gate int64
}

func (r *reader) run(ctx context.Context) error {
	work, stopWork := engine.ShutdownContext(ctx, r.cfg.ShutdownTimeout)
	defer stopWork()
	stopLag := r.watchLag(ctx)
	defer stopLag()
	eng := r.eng
	vitals := &eng.Vitals
	log := r.cfg.Logger.With("consumer", r.cfg.Name, "stream", r.stream)
	key := store.StreamLockKey(r.cfg.Tables, r.cfg.Name, r.stream)
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
	last, ok, err := store.Checkpoint(ctx, r.cfg.Pool, r.cfg.Tables, r.cfg.Name, r.stream)
	if err != nil {
		return err
	}
	from := int64(0)
	if ok {
		from = last + 1
	}
	r.eng.Lag.Checkpoint.Store(from - 1)
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // owned: ends with fctx, which follow cancels on return
		select {
		case <-lock.Lost():
			cancel(errLockLost)
		case <-fctx.Done():
		}
	}()
	err = r.env.Follow(fctx, r.stream, from, r.cfg.BatchMaxSize, func(_ context.Context, recs []streamio.Record) error {
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
	items := r.eng.PrepareAll(streamio.Messages(r.stream, recs, time.Now()))
	err := r.eng.RunOrdered(ctx, work, items, engine.Ordered{
		Gate:           r.gate,
		RetryBaseDelay: r.cfg.RetryBaseDelay, RetryMaxDelay: r.cfg.RetryMaxDelay,
		Checkpoint: func(ctx context.Context, tx pgx.Tx, upTo int64) error {
			return store.AdvanceCheckpoint(ctx, tx, r.cfg.Tables, r.cfg.Name, r.stream, upTo)
		},
	})
	if err == nil {
		r.eng.Lag.Checkpoint.Store(recs[len(recs)-1].Offset)
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
			if tail, ok, err := r.env.Tail(ctx, r.stream); err == nil && ok {
				r.eng.Lag.Tail.Store(tail)
			}
			if !retry.Sleep(ctx, 10*time.Second) {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
