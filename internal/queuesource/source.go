// Package queuesource feeds the engine from a RabbitMQ queue: it consumes
// with manual acks, routes deliveries to batch workers (by ordering key when
// there is one), runs redelivered messages alone, and settles each batch
// with the broker after it committed — acks, nacks, and confirmed publishes
// to the retry and dead-letter queues. It reconnects with backoff, keeps
// every delivery tied to the session that delivered it, and bounds in bytes
// what it holds in memory.
package queuesource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
)

// Topology says what the source does with its queues at start.
type Topology int

const (
	// Declare declares the queue, the retry queue and the dead-letter queue.
	Declare Topology = iota
	// Passive checks that they exist.
	Passive
	// Existing uses them as they are.
	Existing
)

// Config configures a Source; the consumer fills in every field.
type Config struct {
	Name, AMQPURL, ConnectionName                 string
	Queue, RetryQueue, DeadLetterQueue, QueueType string
	Topology                                      Topology
	DeliveryLimit, Prefetch, Workers              int
	BatchMaxSize                                  int
	BatchMaxWait                                  time.Duration
	MaxBufferedBytes                              int64
	ReconnectMaxDelay                             time.Duration
	RetryBaseDelay, RetryMaxDelay                 time.Duration
	CommitTimeout, ShutdownTimeout                time.Duration
	Logger                                        *slog.Logger
	// Prepare turns a delivery into an engine item (Msg is the consumer's
	// message). It runs on the routing goroutine.
	Prepare func(d *amqp.Delivery, received time.Time) *engine.Item
	// OrderingKey, when set, keeps items with one key on one worker, in order.
	OrderingKey func(*engine.Item) string
	// AffinityKey, when set and OrderingKey is not, sends items with one key
	// to one worker, so that concurrent batches rarely write the same rows;
	// unlike OrderingKey it keeps no order (a postponed item runs later).
	AffinityKey func(*engine.Item) string
	// AfterCommit, when set (tests), runs after each commit, before the acks.
	AfterCommit func()
}

// Source consumes one queue into an engine.
type Source struct {
	cfg Config
	eng *engine.Engine
	gen atomic.Uint64
	// held is the gate's account of the current session, for Stats.
	held atomic.Int64
}

// New returns a Source feeding eng.
func New(cfg Config, eng *engine.Engine) *Source { return &Source{cfg: cfg, eng: eng} }

// BufferedBytes is what the current session holds in memory of deliveries
// not yet settled.
func (src *Source) BufferedBytes() int64 { return src.held.Load() }

// Run consumes until ctx is cancelled, reconnecting (with capped exponential
// backoff) whenever a connection or a channel dies. On cancellation it stops
// consuming, lets the batches in flight commit and settle (on a context
// detached from ctx, bounded by ShutdownTimeout), leaves deliveries that were
// never started unacked for the next consumer, closes, and returns nil. It
// returns an error wrapping ErrFatal for what reconnecting cannot fix.
//
// The backoff runs across sessions: a failed connect and a session that
// ended without doing any good (see session.worked) both count as a failure,
// so a session that the same cause ends as soon as it starts (a dead-letter
// queue that refuses every dead letter) is retried ever more slowly, up to
// ReconnectMaxDelay. After a session that worked, the next attempt waits as
// after a first failure.
func (src *Source) Run(ctx context.Context) (err error) {
	stopped := src.eng.Started(ctx)
	defer func() { stopped(err) }()
	vitals := &src.eng.Vitals
	work, stopWork := engine.ShutdownContext(ctx, src.cfg.ShutdownTimeout)
	defer stopWork()
	log := src.cfg.Logger.With("consumer", src.cfg.Name, "queue", src.cfg.Queue)
	tel := src.eng.Telemetry()
	for failures := 0; ; {
		s, err := src.connect(ctx, work, src.gen.Add(1))
		if err != nil {
			if errors.Is(err, ErrFatal) {
				log.Error("broker refused the consumer; not retrying", "error", err)
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			failures++
			delay := retry.Backoff(failures, reconnectBaseDelay, src.cfg.ReconnectMaxDelay)
			log.Warn("broker unavailable, retrying", "error", err, "retry_in", delay)
			vitals.SetTrouble("broker unavailable: " + err.Error())
			if !retry.Sleep(ctx, delay) {
				return nil
			}
			continue
		}
		if s.gen > 1 {
			tel.Reconnect(ctx)
			src.eng.Counts.Reconnects.Add(1)
		}
		log.Info("broker session started", "generation", s.gen, "url", RedactURL(src.cfg.AMQPURL),
			"prefetch", src.cfg.Prefetch, "max_buffered_bytes", src.cfg.MaxBufferedBytes)
		vitals.SetTrouble("")
		started := time.Now()
		err = src.serve(ctx, s)
		vitals.Connected.Store(false)
		if err != nil {
			vitals.SetTrouble("broker session ended: " + err.Error())
		}
		s.close()
		if ctx.Err() != nil {
			log.Info("broker session ended: shutdown", "generation", s.gen)
			return nil
		}
		if errors.Is(err, ErrFatal) {
			log.Error("broker session ended; not retrying", "generation", s.gen, "error", err)
			return err
		}
		if s.worked(time.Since(started)) {
			failures = 0 // back off from scratch
		}
		failures++
		delay := retry.Backoff(failures, reconnectBaseDelay, src.cfg.ReconnectMaxDelay)
		log.Warn("broker session ended, reconnecting", "generation", s.gen, "error", err, "retry_in", delay)
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
}

// reconnectBaseDelay is the backoff's first delay (see retry.Backoff).
const reconnectBaseDelay = 100 * time.Millisecond

// Declare connects once and sets up the topology as Config.Topology says.
// Each broker call is bounded by CommitTimeout and ends with ctx.
func (src *Source) Declare(ctx context.Context) error {
	conn, sock, err := src.dial(ctx, src.cfg.ConnectionName, nil)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(closeTimeout)) }()
	var ch *amqp.Channel
	if err := src.brokerCall(ctx, sock, func() (err error) { ch, err = conn.Channel(); return err }); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := src.brokerCall(ctx, sock, func() error { return src.declare(ch) }); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	return ctx.Err()
}
