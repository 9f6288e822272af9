package consumer

// The stream source: one active reader per (Name, Stream) across processes,
// chosen by a PostgreSQL advisory lock; it follows the stream from after
// the consumer's checkpoint and runs each batch of records in order
// (engine.RunOrdered), writing the checkpoint in the batch's transaction.
// A reading session that fails resumes from the checkpoint after a
// backoff. At each session's start it declares or checks the stream, as
// Config.Topology says.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
)

// streamSource reads Config.Stream into the engine. It reads the
// consumer's Config directly, as queueSource does.
type streamSource struct {
	cfg Config
	eng *engine.Engine
}

func newStreamSource(cfg Config, eng *engine.Engine) *streamSource {
	return &streamSource{cfg: cfg, eng: eng}
}

// BufferedBytes is 0: what a stream reader buffers is bounded by
// BatchMaxSize records and the client's credits, not counted in bytes.
func (src *streamSource) BufferedBytes() int64 { return 0 }

// Run reads the stream until ctx is cancelled. Only the process holding the
// stream's advisory lock reads; the others wait for it. On cancellation the
// batch in progress commits (bounded by ShutdownTimeout) and Run returns
// nil. Reading that fails (a lost connection, a lost lock) resumes from the
// checkpoint after a backoff; what resuming cannot fix (access refused, a
// stream that does not exist and is not to be declared, a queue of another
// type by its name) returns an error wrapping errFatal.
func (src *streamSource) Run(ctx context.Context) (err error) {
	stopped := src.eng.Started(ctx)
	defer func() { stopped(err) }()
	env, err := src.open(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = env.Close() }()
	r := &reader{cfg: src.cfg, eng: src.eng, env: env, gate: store.SwapGate(src.cfg.Tables, src.cfg.Name, src.cfg.Stream)}
	return r.run(ctx)
}

// Declare connects once and declares or checks the stream as
// Config.Topology says.
func (src *streamSource) Declare(ctx context.Context) error {
	env, err := src.open(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = env.Close() }()
	return ensureStream(ctx, env, &src.cfg)
}

// open connects to the stream protocol at StreamURL. A refusal (ErrAccessRefused)
// wraps errFatal.
func (src *streamSource) open(ctx context.Context) (*streamio.Env, error) {
	env, err := streamio.Open(ctx, streamio.Config{URI: src.cfg.StreamURL, Logger: src.cfg.Logger})
	if errors.Is(err, streamio.ErrAccessRefused) {
		return nil, fmt.Errorf("%w: stream %s: %w", errFatal, src.cfg.Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", src.cfg.Stream, err)
	}
	return env, nil
}

// ensureStream declares the stream (Declare, see declareStream), checks
// that it exists (Passive), or does nothing (Existing), bounded by
// CommitTimeout and ctx.
func ensureStream(ctx context.Context, env *streamio.Env, cfg *Config) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.CommitTimeout)
	defer cancel()
	switch cfg.Topology {
	case Declare:
		return declareStream(ctx, env, cfg)
	case Passive:
		ok, err := env.StreamExists(ctx, cfg.Stream)
		if err != nil {
			return fmt.Errorf("stream %s: %w", cfg.Stream, err)
		}
		if !ok {
			return missingStream(cfg)
		}
	}
	return nil
}

// declareStream declares the stream through AMQP 0-9-1, as the queues are
// declared and as a publisher over AMQP 0-9-1 declares one: durable,
// x-queue-type stream, no other argument. (The stream protocol's
// declaration, as the Go stream client makes it, adds a leader locator,
// which a publisher's AMQP 0-9-1 declaration would then find inequivalent.)
// A stream that exists with other arguments — a retention, a leader
// locator — is used as it is: none of them changes what idem guarantees. A
// queue of another type by the stream's name is refused, errFatal, as a
// queue declared with other arguments is.
func declareStream(ctx context.Context, env *streamio.Env, cfg *Config) error {
	fail := func(err error) error {
		if errors.Is(err, amqpconn.ErrRefused) || fatal(err) {
			return fmt.Errorf("%w: stream %s: declare: %v", errFatal, cfg.Stream, err)
		}
		return fmt.Errorf("stream %s: declare: %w", cfg.Stream, err)
	}
	conn, err := amqpconn.Dial(ctx, cfg.nodes(), "idem:"+cfg.Name+" (declare "+cfg.Stream+")", cfg.CommitTimeout)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = conn.Close() }()
	var ch *amqp.Channel
	err = conn.Call(func() (err error) { ch, err = conn.Channel(); return err })
	if err == nil {
		err = conn.Call(func() error {
			_, err := ch.QueueDeclare(cfg.Stream, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
			return err
		})
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		if err != nil {
			return fail(err)
		}
		return nil
	}
	ok, err := env.StreamExists(ctx, cfg.Stream)
	switch {
	case err != nil:
		return fmt.Errorf("stream %s: %w", cfg.Stream, err)
	case !ok:
		return fmt.Errorf("%w: stream %s: a queue of another type has the name (%v): "+
			"delete it, or give Config.Stream another name", errFatal, cfg.Stream, ae)
	}
	cfg.Logger.Info("the stream exists with other arguments than idem declares; used as it is",
		"consumer", cfg.Name, "stream", cfg.Stream, "broker", ae.Reason)
	return nil
}

// missingStream is the error for a stream that does not exist when
// Topology says not to declare it.
func missingStream(cfg *Config) error {
	return fmt.Errorf("%w: stream %s does not exist: declare it (a queue with x-queue-type stream, durable) before "+
		"the consumer starts, or leave Config.Topology at Declare for the consumer to declare it", errFatal, cfg.Stream)
}

// errLockLost ends a reading session whose advisory lock went away.
var errLockLost = errors.New("stream: lost the stream lock")

// reader is one Run of a streamSource.
type reader struct {
	cfg Config
	eng *engine.Engine
	env *streamio.Env
	// gate orders the batches with a rebuild's swap (store.SwapGate).
	gate int64
	// ensured says the stream was declared or checked (ensure): once per
	// Run, before its first reading session.
	ensured bool
}

// run is the session loop: declare or check the stream, wait for the
// lock, follow the stream, and after a failure back off and start again.
func (r *reader) run(ctx context.Context) error {
	work, stopWork := engine.ShutdownContext(ctx, r.cfg.ShutdownTimeout)
	defer stopWork()
	stopLag := r.watchLag(ctx)
	defer stopLag()
	eng := r.eng
	log := r.cfg.Logger.With("consumer", r.cfg.Name, "stream", r.cfg.Stream)
	for failures := 0; ; {
		worked, err := r.session(ctx, work, log)
		if ctx.Err() != nil {
			log.Info("stream reader stopped: shutdown")
			return nil
		}
		if worked {
			failures = 0 // back off from scratch
		}
		eng.Vitals.Connected.Store(false)
		if errors.Is(err, streamio.ErrStreamNotFound) && r.cfg.Topology != Declare {
			err = missingStream(&r.cfg)
		}
		if errors.Is(err, errFatal) {
			log.Error("the broker refused the stream reader; not retrying", "error", err)
			return err
		}
		failures++
		delay := retry.Backoff(failures, reconnectBaseDelay, r.cfg.ReconnectMaxDelay)
		eng.Vitals.SetTrouble(fmt.Sprintf("stream reading stopped: %v", err))
		log.Warn("stream reading stopped, resuming from the checkpoint", "error", err, "retry_in", delay)
		eng.Telemetry().Reconnect(ctx)
		eng.Counts.Reconnects.Add(1)
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
}

// session declares or checks the stream, waits to become the active
// reader, and follows the stream until it fails or ctx ends. It reports
// whether the session worked (see sessionWorked).
func (r *reader) session(ctx, work context.Context, log *slog.Logger) (worked bool, err error) {
	if !r.ensured {
		if err := r.ensure(ctx); err != nil {
			return false, err
		}
		r.ensured = true
	}
	log.Info("waiting to become the active stream reader")
	r.eng.Vitals.Connected.Store(true) // a hot standby is ready to take over
	key := store.StreamLockKey(r.cfg.Tables, r.cfg.Name, r.cfg.Stream)
	lock, err := pglock.Acquire(ctx, r.cfg.Pool, key, pglock.Config{Logger: r.cfg.Logger})
	if err != nil {
		return false, err
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()
	log.Info("active stream reader")
	batches, started := r.eng.Counts.Batches.Load(), time.Now()
	err = r.follow(ctx, work, lock)
	return sessionWorked(r.eng.Counts.Batches.Load() > batches, time.Since(started)), err
}

// ensure declares or checks the stream as Topology says (ensureStream),
// once per Run. A consumer that has a checkpoint on the stream has read it:
// if the stream is missing now, it was deleted, and ensure does not declare
// it again (a new stream's offsets start at 0, and reading it from after
// the checkpoint would skip its first records): the error says so.
func (r *reader) ensure(ctx context.Context) error {
	last, read, err := store.Checkpoint(ctx, r.cfg.Pool, r.cfg.Tables, r.cfg.Name, r.cfg.Stream)
	if err != nil {
		return err
	}
	if !read || r.cfg.Topology != Declare {
		return ensureStream(ctx, r.env, &r.cfg)
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommitTimeout)
	defer cancel()
	ok, err := r.env.StreamExists(cctx, r.cfg.Stream)
	switch {
	case err != nil:
		return fmt.Errorf("stream %s: %w", r.cfg.Stream, err)
	case !ok:
		return fmt.Errorf("%w: stream %s does not exist, but consumer %s read it up to offset %d: it was deleted. "+
			"idem does not declare it again, since reading a new stream from offset %d would skip its first records: "+
			"declare it and delete the consumer's checkpoint row (%s) to read it from its start",
			errFatal, r.cfg.Stream, r.cfg.Name, last, last+1, r.cfg.Tables.WithDefaults().Table("checkpoints"))
	}
	return nil
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
		if err := r.checkNotRecreated(ctx, last); err != nil {
			return err
		}
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
	err = r.env.Follow(fctx, r.cfg.Stream, from, r.cfg.BatchMaxSize, func(_ context.Context, recs []streamio.Record) error {
		return r.batch(fctx, work, recs)
	})
	if cause := context.Cause(fctx); errors.Is(cause, errLockLost) {
		return errLockLost
	}
	return err
}

// checkNotRecreated refuses to follow a stream whose last offset is below
// the checkpoint last: it was deleted and declared again, and waiting for
// offset last+1 would skip the new stream's records up to it without a
// word. The session fails (and the consumer reports the trouble) until an
// operator deletes the checkpoint or the stream grows past it.
func (r *reader) checkNotRecreated(ctx context.Context, last int64) error {
	tail, has, err := r.env.Tail(ctx, r.cfg.Stream)
	if err != nil {
		return err
	}
	if has && tail >= last {
		return nil
	}
	if !has {
		tail = -1
	}
	return fmt.Errorf("stream %s ends at offset %d, below consumer %s's checkpoint %d: the stream was deleted and "+
		"declared again; delete the checkpoint row (%s) to read the new stream from its start",
		r.cfg.Stream, tail, r.cfg.Name, last, r.cfg.Tables.WithDefaults().Table("checkpoints"))
}

// batch runs one batch of consecutive records in order (engine.RunOrdered),
// writing the checkpoint in each transaction. Each transaction begins by
// taking the swap gate in shared mode: a rebuild swapping the projection's
// tables in waits for it, and the next batch waits for the swap, so that
// it writes to the new tables, after the rebuild's last message. A record
// the stream client could not decode is dead-lettered as undecodable, and
// the checkpoint moves past it.
func (r *reader) batch(ctx, work context.Context, recs []streamio.Record) error {
	items := r.eng.PrepareAll(streamio.Messages(r.cfg.Stream, recs, time.Now()))
	for i := range recs {
		if recs[i].Undecodable != nil {
			items[i].Undecodable(recs[i].Undecodable)
		}
	}
	err := r.eng.RunOrdered(ctx, work, items, engine.Ordered{
		Gate:           r.gate,
		RetryBaseDelay: r.cfg.RetryBaseDelay, RetryMaxDelay: r.cfg.RetryMaxDelay,
		Checkpoint: func(ctx context.Context, tx pgx.Tx, upTo int64) error {
			return store.AdvanceCheckpoint(ctx, tx, r.cfg.Tables, r.cfg.Name, r.cfg.Stream, upTo)
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
			if tail, ok, err := r.env.Tail(ctx, r.cfg.Stream); err == nil && ok {
				r.eng.Lag.Tail.Store(tail)
			}
			if !retry.Sleep(ctx, 10*time.Second) {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}
