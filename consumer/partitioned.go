package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/partlease"
	"github.com/idemkit/idem/internal/retry"
)

// partitionedSource consumes a partitioned queue: the consistent-hash exchange
// named Config.Queue in front of Config.Partitions partition queues, each
// with its own retry queue and one dead-letter queue for all. The lease
// (package partlease) decides which partitions this process holds; for
// each, a queueSource of that partition consumes it with the engine they share,
// and stops (its batches settled, its connections closed, what it never
// started back in the queue) before the lease lets the partition go. Each
// partition queue has a single active consumer, so a partition whose lease
// moved while its old holder still consumes waits for it.
type partitionedSource struct {
	cfg         Config
	eng         *engine.Engine
	lease       *partlease.Lease
	afterCommit func() // tests: see newQueueSource

	mu    sync.Mutex
	parts map[int]*queueSource // the partitions consumed now
}

// newPartitionedSource returns a partitionedSource of cfg's Queue feeding
// eng, holding partitions as its lease decides: one lease per schema,
// consumer name and queue.
func newPartitionedSource(cfg Config, eng *engine.Engine, afterCommit func()) (*partitionedSource, error) {
	lease, err := partlease.New(partlease.Config{
		Key: cfg.Tables.Schema + "/" + cfg.Name + "/" + cfg.Queue, Partitions: cfg.Partitions,
		Conn: cfg.Pool.Config().ConnConfig, Logger: cfg.Logger,
		// The gauge of partitions without a holder carries the consumer's metric attributes.
		MeterProvider: cfg.MeterProvider, Attributes: []attribute.KeyValue{semconv.MessagingSystemRabbitMQ,
			semconv.MessagingConsumerGroupName(cfg.Name), semconv.MessagingDestinationSubscriptionName(cfg.Queue)},
	})
	if err != nil {
		return nil, err
	}
	return &partitionedSource{cfg: cfg, eng: eng, lease: lease, afterCommit: afterCommit, parts: map[int]*queueSource{}}, nil
}

// partition returns partition i's queueSource: its queue and retry queue,
// bound to the exchange.
func (p *partitionedSource) partition(i int) *queueSource {
	src := newQueueSource(p.cfg.partition(i), p.eng, p.afterCommit)
	src.exchange = amqpnames.PartitionExchange(p.cfg.Queue)
	return src
}

// partition is the configuration of partition i of c's partitioned queue:
// its queue, its own retry queue, and a connection name of its own.
func (c *Config) partition(i int) Config {
	p := *c
	p.ConnectionName = fmt.Sprintf("%s p%d", c.ConnectionName, i)
	p.Queue = amqpnames.PartitionQueue(c.Queue, i)
	p.RetryQueue = amqpnames.RetryQueue(p.Queue)
	return p
}

// Run consumes the partitions this process holds until ctx is cancelled
// (see queueSource.Run for what each does on cancellation), first
// declaring every partition (as Config.Topology says): the exchange's hash
// ring is made of its bindings, so all of them exist before any is
// consumed. It returns an error wrapping errFatal for what reconnecting
// cannot fix.
func (p *partitionedSource) Run(ctx context.Context) (err error) {
	stopped := p.eng.Started(ctx)
	defer func() { stopped(err) }()
	for failures := 0; ; failures++ {
		err := p.Declare(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errFatal) {
			return err
		}
		delay := retry.Backoff(failures+1, reconnectBaseDelay, p.cfg.ReconnectMaxDelay)
		p.cfg.Logger.Warn("broker unavailable, retrying", "consumer", p.cfg.Name, "queue", p.cfg.Queue, "error", err, "retry_in", delay)
		p.eng.Vitals.SetTrouble("broker unavailable: " + err.Error())
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
	vctx, stopVitals := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { // owned by Run: stopped and waited for below
		defer close(watched)
		p.watch(vctx)
	}()
	defer func() { stopVitals(); <-watched }()
	return p.lease.Run(ctx, p.consume)
}

// consume runs partition i's queueSource until ctx ends.
func (p *partitionedSource) consume(ctx context.Context, i int) error {
	src := p.partition(i)
	src.changed = p.update
	p.mu.Lock()
	p.parts[i] = src
	p.mu.Unlock()
	p.update()
	defer func() {
		p.mu.Lock()
		delete(p.parts, i)
		p.mu.Unlock()
		p.update()
	}()
	return src.consume(ctx)
}

// update sets the engine's Connected: this process is a member of the
// lease and every partition it holds has a session consuming. A member
// holding none (more processes than partitions) is a standby, connected.
func (p *partitionedSource) update() {
	st := p.lease.Status()
	ok := st.Joined
	p.mu.Lock()
	for _, src := range p.parts {
		ok = ok && src.connected.Load()
	}
	p.mu.Unlock()
	p.eng.Vitals.Connected.Store(ok)
	if !st.Joined && st.Trouble != "" {
		p.eng.Vitals.SetTrouble(st.Trouble)
	}
}

// watch keeps the engine's Connected up to date (see update) as the
// lease's membership changes; the partitions' Sources update it as their
// sessions come and go.
func (p *partitionedSource) watch(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		p.update()
		select {
		case <-ctx.Done():
			p.eng.Vitals.Connected.Store(false)
			return
		case <-t.C:
		}
	}
}

// BufferedBytes is what the partitions' sessions hold in memory of
// deliveries not yet settled.
func (p *partitionedSource) BufferedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, src := range p.parts {
		n += src.BufferedBytes()
	}
	return n
}

// Declare connects once and sets up every partition (its queue, retry
// queue and binding), the exchange and the dead-letter queue, as
// Config.Topology says.
func (p *partitionedSource) Declare(ctx context.Context) error {
	parts := make([]*queueSource, p.cfg.Partitions)
	for i := range parts {
		parts[i] = p.partition(i)
	}
	return declareAll(ctx, parts...)
}
