package queuesource

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/partlease"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/partitions"
)

// Partitioned consumes a partitioned queue: the consistent-hash exchange
// named Config.Queue in front of Config.Partitions partition queues, each
// with its own retry queue and one dead-letter queue for all. The lease
// (package partlease) decides which partitions this process holds; for
// each, a Source of that partition consumes it with the engine they share,
// and stops (its batches settled, its connections closed, what it never
// started back in the queue) before the lease lets the partition go. Each
// partition queue has a single active consumer, so a partition whose lease
// moved while its old holder still consumes waits for it.
type Partitioned struct {
	cfg   Config
	eng   *engine.Engine
	lease *partlease.Lease

	mu    sync.Mutex
	parts map[int]*Source // the partitions consumed now
}

// NewPartitioned returns a Partitioned feeding eng, holding partitions as
// lease decides.
func NewPartitioned(cfg Config, eng *engine.Engine, lease *partlease.Lease) *Partitioned {
	return &Partitioned{cfg: cfg, eng: eng, lease: lease, parts: map[int]*Source{}}
}

// partition returns the configuration of partition i's Source.
func (p *Partitioned) partition(i int) Config {
	c := p.cfg
	c.Queue = partitions.QueueName(p.cfg.Queue, i)
	c.RetryQueue = c.Queue + ".retry"
	c.Exchange = p.cfg.Queue
	c.ConnectionName = fmt.Sprintf("%s p%d", p.cfg.ConnectionName, i)
	return c
}

// Run consumes the partitions this process holds until ctx is cancelled
// (see Source.Run for what each does on cancellation), first declaring
// every partition (Config.Declare): the exchange's hash ring is made of
// its bindings, so all of them exist before any is consumed. It returns an
// error wrapping ErrFatal for what reconnecting cannot fix.
func (p *Partitioned) Run(ctx context.Context) (err error) {
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
		if errors.Is(err, ErrFatal) {
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

// consume runs partition i's Source until ctx ends.
func (p *Partitioned) consume(ctx context.Context, i int) error {
	src := New(p.partition(i), p.eng)
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
func (p *Partitioned) update() {
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
func (p *Partitioned) watch(ctx context.Context) {
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
func (p *Partitioned) BufferedBytes() int64 {
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
// Config.Declare and Config.Passive say.
func (p *Partitioned) Declare(ctx context.Context) error {
	parts := make([]*Source, p.cfg.Partitions)
	for i := range parts {
		parts[i] = New(p.partition(i), p.eng)
	}
	return declareAll(ctx, parts...)
}
