package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
)

// Consumer runs a Handler over a queue or a stream. Create it with New,
// register the handler with Handle, then call Run.
type Consumer struct {
	cfg     Config
	eng     *engine.Engine
	src     source // nil without a Queue or a Stream
	running atomic.Bool
}

// New validates cfg, fills in defaults and returns a Consumer. It does not
// connect: Run does, and Run needs a Queue and its broker (AMQPURL or
// AMQPURLs), or a Stream; Process needs neither.
func New(cfg Config) (*Consumer, error) { return build(cfg, nil) }

// build is New; afterCommit, when set (tests of this package), runs after
// each commit and before the acks: the crash window of invariant 2.
func build(cfg Config, afterCommit func()) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg}
	var err error
	if c.eng, err = engine.New(cfg.engineConfig()); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if _, err := health.ObserveReady(cfg.MeterProvider, health.ReporterFunc(c.readiness)); err != nil {
		return nil, fmt.Errorf("consumer: readiness gauge: %w", err)
	}
	switch {
	case cfg.Partitions > 0:
		if c.src, err = newPartitionedSource(cfg, c.eng, afterCommit); err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
	case cfg.Queue != "":
		c.src = newQueueSource(cfg, c.eng, afterCommit)
	case cfg.Stream != "":
		c.src = newStreamSource(cfg, c.eng)
	}
	return c, nil
}

// source is what a consumer with a Queue or a Stream runs: one queue
// (queueSource), its partitions (partitionedSource), or a stream
// (streamSource).
type source interface {
	Run(ctx context.Context) error
	Declare(ctx context.Context) error
	BufferedBytes() int64
}

// Handle sets the handler. Call it once, before Run.
func (c *Consumer) Handle(h Handler) { c.eng.SetHandler(h) }

// HandleBatch sets an optional handler that processes all of a batch's new
// messages at once — a projection written with one set-based statement
// instead of one per message. It must have the same effect as Handle's
// handler run on each message in order. When it fails, the batch runs again
// message by message with Handle's handler, a savepoint each, so that each
// failure is attributed to its message; Handle is therefore still required.
// Read-only (forensic) and repair replays always run message by message.
func (c *Consumer) HandleBatch(h BatchHandler) { c.eng.SetBatchHandler(h) }

// Config returns the configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// Runtime returns the machinery that runs the consumer's handlers, for
// idem's own packages that drive it from another source (replay). Its
// dynamic type is internal to idem: outside the module it is of no use.
func (c *Consumer) Runtime() any { return c.eng }

// Run consumes the queue, or reads the stream, until ctx is cancelled,
// reconnecting (with capped exponential backoff) whenever a connection or a
// channel dies. On cancellation it stops consuming, lets in-flight batches
// commit and ack (on a context detached from ctx, bounded by
// ShutdownTimeout), leaves deliveries that were never started unacked for
// the next consumer, closes, and returns nil. It returns an error only for
// what reconnecting cannot fix: credentials the broker refuses, a vhost
// that does not exist, no access to the vhost, the queue or the stream, a
// queue declared with other arguments, a stream that does not exist while
// Topology says not to declare it, a queue of another type by the stream's
// name. The package documentation's Streams section says how a stream is
// read.
func (c *Consumer) Run(ctx context.Context) error {
	switch {
	case c.eng.Config().Handler == nil:
		return configError("no handler: call Handle before Run")
	case c.src == nil: // New made sure a Queue has its broker
		return configError("Run needs a Queue or a Stream")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run is already running")
	}
	defer c.running.Store(false)
	err := c.src.Run(ctx)
	if errors.Is(err, errFatal) {
		return fmt.Errorf("consumer %s: %w", c.cfg.Name, err)
	}
	return err
}

// Declare connects once and sets up the topology (the queues, or the
// stream) as Config.Topology says, so that publishers can start before the
// first worker does.
func (c *Consumer) Declare(ctx context.Context) error {
	if c.src == nil {
		return configError("Declare needs a Queue or a Stream")
	}
	if err := c.src.Declare(ctx); err != nil {
		return fmt.Errorf("consumer: declare: %w", err)
	}
	return nil
}

// Queues returns the names of the queues Declare and Run declare (or check,
// as Config.Topology says): Config.Queue, or with Partitions its partition
// queues (partitions.QueueName), each followed by its retry queue, then
// Config.DeadLetterQueue. A partitioned consumer also declares an exchange
// named Config.Queue. A consumer without a Queue has none.
func (c *Consumer) Queues() []string {
	if c.src == nil {
		return nil
	}
	return c.cfg.queues()
}

// Process runs msgs as one batch through the same pipeline as Run (payload
// hash, identity, inbox claim, handler, dead-letter rows, commit) without a
// broker, and reports what became of each message. The caller sets what a
// source would (MessageID, Body, Headers, …); Process derives each
// message's ID, Hash and BusinessKey in place, sets Source to Config.Queue
// (or Stream, or Name) and ReceivedAt to now when they are empty. Nothing is
// published: a Retried message is simply not committed, a DeadLettered one
// has its row in the dead-letter table. Process needs no AMQPURL or Queue;
// it is what tests (see package consumertest) and custom sources call. An
// error means the batch transaction failed as a whole: nothing of it is
// known to have committed; run it again.
func (c *Consumer) Process(ctx context.Context, msgs []Message) ([]Result, error) {
	if c.eng.Config().Handler == nil {
		return nil, configError("no handler: call Handle before Process")
	}
	items := c.eng.PrepareAll(msgs)
	res, err := c.eng.RunWithoutRetries(ctx, items)
	if err != nil {
		return nil, fmt.Errorf("consumer: process: %w", err)
	}
	out := make([]Result, len(res))
	for i, r := range res {
		out[i] = Result{Message: items[i].Message, Outcome: r.Outcome, Inbox: r.Inbox, StoredHash: r.StoredHash,
			Reason: r.Reason, Err: r.Err}
	}
	return out, nil
}

// Result is what became of one message passed to Process.
type Result struct {
	// Message is the message, with the identity Process derived.
	Message *Message
	// Outcome is what became of it: idem.Processed, idem.Duplicate,
	// idem.DeadLettered, idem.Retried or idem.Unresolved.
	Outcome idem.Outcome
	// Inbox is what the inbox held before the message: inbox.NewMessage,
	// inbox.Duplicate or inbox.Conflict; 0 when it was never looked up.
	Inbox inbox.Decision
	// StoredHash is the hash the inbox holds, for duplicates and conflicts.
	StoredHash idem.Hash
	// Reason is the dead-letter reason, for DeadLettered.
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
}
