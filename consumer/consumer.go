package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/queuesource"
	"github.com/idemkit/idem/internal/seam"
)

// Consumer runs a Handler over a queue. Create it with New, register the
// handler with Handle, then call Run.
type Consumer struct {
	cfg     Config
	eng     *engine.Engine
	src     *queuesource.Source // nil for a stream consumer
	tel     *engine.Telemetry
	handler Handler
	batch   BatchHandler
	source  string // the queue or stream name
	running atomic.Bool
	lag     engine.Lag

	// afterCommit, when set by tests of this package, runs after each
	// successful commit and before the acks: the crash window of invariant 2.
	afterCommit func()
}

func init() {
	seam.Of = func(v any) (seam.Consumer, bool) {
		c, ok := v.(*Consumer)
		if !ok || c == nil {
			return seam.Consumer{}, false
		}
		return seam.Consumer{Engine: c.eng, Prepare: c.prepareAll, Lag: &c.lag}, true
	}
}

// New validates cfg, fills in defaults and returns a Consumer. It does not
// connect: Run does, and Run needs AMQPURL and Queue; Process needs neither.
func New(cfg Config) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, source: cfg.Queue}
	if cfg.Stream != "" {
		c.source = cfg.Stream
	}
	if c.source == "" {
		c.source = cfg.Name
	}
	var err error
	if c.tel, err = engine.NewTelemetry(cfg.Name, c.source, cfg.MeterProvider, cfg.TracerProvider, c.lag.Value); err != nil {
		return nil, fmt.Errorf("consumer: telemetry: %w", err)
	}
	c.eng, err = engine.New(engine.Config{
		Name: cfg.Name, Pool: cfg.Pool, Tables: cfg.Tables, Logger: cfg.Logger.With("consumer", cfg.Name),
		Telemetry: c.tel, Handler: c.runHandler, DeadLetterReason: deadLetterReason,
		BatchRetries: cfg.BatchRetries, MaxAttempts: cfg.MaxAttempts, MaxCrashes: cfg.MaxCrashes,
		CommitTimeout: cfg.CommitTimeout, HandlerTimeout: cfg.HandlerTimeout, LockTimeout: cfg.LockTimeout,
		MaxConcurrency: cfg.Workers, StorePayloads: cfg.StorePayloads,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if cfg.Queue != "" {
		sc := cfg.sourceConfig()
		sc.Prepare = c.fromDelivery
		sc.AfterCommit = func() {
			if c.afterCommit != nil {
				c.afterCommit()
			}
		}
		if cfg.OrderingKey != nil {
			sc.OrderingKey = func(it *engine.Item) string { return cfg.OrderingKey(it.Msg.(*Message)) }
		}
		if cfg.BusinessKey != nil {
			// Without an ordering key, the business key schedules: messages
			// of one key go to one worker, whose batches then rarely meet
			// another worker's rows.
			sc.AffinityKey = func(it *engine.Item) string { return it.BusinessKey }
		}
		c.src = queuesource.New(sc, c.eng)
	}
	return c, nil
}

// Handle sets the handler. Call it once, before Run.
func (c *Consumer) Handle(h Handler) { c.handler = h }

// HandleBatch sets an optional handler that processes all of a batch's new
// messages at once — a projection written with one set-based statement
// instead of one per message. It must have the same effect as Handle's
// handler run on each message in order. When it fails, the batch runs again
// message by message with Handle's handler, a savepoint each, so that each
// failure is attributed to its message; Handle is therefore still required.
// Read-only (forensic) and repair replays always run message by message.
func (c *Consumer) HandleBatch(h BatchHandler) {
	c.batch = h
	c.eng.SetBatchHandler(c.runBatchHandler)
}

// Config returns the configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// Run consumes the queue until ctx is cancelled, reconnecting (with capped
// exponential backoff) whenever a connection or a channel dies. On
// cancellation it stops consuming, lets in-flight batches commit and ack (on
// a context detached from ctx, bounded by ShutdownTimeout), leaves
// deliveries that were never started unacked for the next consumer, closes,
// and returns nil. It returns an error only for what reconnecting cannot
// fix: a wrong configuration, credentials the broker refuses, no access to
// the vhost or the queue. A stream consumer runs with stream.Run instead.
func (c *Consumer) Run(ctx context.Context) error {
	switch {
	case c.handler == nil:
		return configError("no handler: call Handle before Run")
	case c.cfg.Stream != "":
		return configError("a stream consumer runs with stream.Run(ctx, c) from package github.com/idemkit/idem/consumer/stream")
	case c.cfg.Queue == "":
		return configError("Run needs Queue")
	case c.cfg.AMQPURL == "":
		return configError("Run needs AMQPURL")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run is already running")
	}
	defer c.running.Store(false)
	err := c.src.Run(ctx)
	if errors.Is(err, queuesource.ErrFatal) {
		return fmt.Errorf("consumer %s: %w", c.cfg.Name, err)
	}
	return err
}

// Declare connects once and sets up the topology as Config.Topology says,
// so that publishers can start before the first worker does.
func (c *Consumer) Declare(ctx context.Context) error {
	if c.src == nil || c.cfg.AMQPURL == "" {
		return configError("Declare needs AMQPURL and Queue")
	}
	if err := c.src.Declare(ctx); err != nil {
		return fmt.Errorf("consumer: declare: %w", err)
	}
	return nil
}

// Process runs msgs as one batch through the same pipeline as Run (payload
// hash, identity, inbox claim, handler, dead-letter rows, commit) without a
// broker, and reports each message's outcome. Nothing is published: a
// Retried message is simply not committed, a DeadLettered one has its row in
// the dead-letter table. Process needs no AMQPURL or Queue; it is what tests
// (see package consumertest) and custom sources call. An error means the
// batch transaction failed as a whole: nothing of it is known to have
// committed; run it again.
func (c *Consumer) Process(ctx context.Context, msgs []Incoming) ([]Outcome, error) {
	if c.handler == nil {
		return nil, configError("no handler: call Handle before Process")
	}
	now := time.Now()
	raws := make([]engine.Raw, len(msgs))
	for i, in := range msgs {
		raws[i] = engine.Raw(in)
		if raws[i].ReceivedAt.IsZero() {
			raws[i].ReceivedAt = now
		}
	}
	items := c.prepareAll(raws)
	results, err := c.eng.Once(ctx, items, engine.Options{})
	if err != nil {
		return nil, fmt.Errorf("consumer: process: %w", err)
	}
	return outcomes(items, results), nil
}

// fromDelivery turns an AMQP delivery into a prepared item.
func (c *Consumer) fromDelivery(d *amqp.Delivery, received time.Time) *engine.Item {
	raw := engine.Raw{
		MessageID: d.MessageId, Body: d.Body, Headers: map[string]any(d.Headers), ContentType: d.ContentType,
		CorrelationID: d.CorrelationId, Exchange: d.Exchange, RoutingKey: d.RoutingKey,
		Redelivered: d.Redelivered, Attempt: 1, Source: c.cfg.Queue, Timestamp: d.Timestamp, ReceivedAt: received,
	}
	if n, ok := queuesource.HeaderInt(d.Headers, "x-delivery-count"); ok && n >= 0 {
		raw.DeliveryCount = n
	}
	return c.prepare(&raw)
}
