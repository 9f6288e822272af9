package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/streamio"
)

// publisher sends the plan at the configured rate: queue messages with
// publisher confirms (a sender, which survives the loss of its node),
// stream messages in small confirmed batches. It records
// when each message was sent (the creation time of stream messages, which
// the orders projection stores) and which probes went out when.
type publisher struct {
	h    *harness
	plan plan

	mu     sync.Mutex
	sentAt []time.Time         // by plan index; zero until sent
	probes map[example][]probe // in publishing order
	notify map[example]chan struct{}
	done   bool
	last   time.Time // when the last message was confirmed
}

// probe is a valid message that recovery watchers look for.
type probe struct {
	at time.Time
	id string
}

func newPublisher(h *harness, p plan) *publisher {
	pub := &publisher{h: h, plan: p, sentAt: make([]time.Time, len(p.msgs)),
		probes: map[example][]probe{}, notify: map[example]chan struct{}{}}
	for _, ex := range h.cfg.examples {
		pub.notify[ex] = make(chan struct{})
	}
	return pub
}

// run publishes the whole plan, paced at rate, and returns when every
// message is confirmed.
func (pub *publisher) run(ctx context.Context, start time.Time) error {
	s := &sender{urls: pub.h.cfg.amqpURLs, name: "idem-soak-publisher", logf: pub.h.logf}
	if err := s.dial(ctx); err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	defer s.close()

	streamQ := make(chan int, 4096)
	streamErr := make(chan error, 1)
	go func() { streamErr <- pub.streamLoop(ctx, streamQ) }()
	stopStream := func() error {
		close(streamQ)
		return <-streamErr
	}

	flush := func() error {
		done, err := s.flush(ctx)
		for _, i := range done {
			pub.sent(i, time.Now())
		}
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	next := 0
	for next < len(pub.plan.msgs) {
		due := min(len(pub.plan.msgs), int(time.Since(start).Seconds()*pub.h.cfg.rate)+1)
		for ; next < due; next++ {
			m := pub.plan.msgs[next]
			if m.ex == orders {
				select {
				case streamQ <- next:
				case <-ctx.Done():
					_ = stopStream()
					return ctx.Err()
				}
				continue
			}
			err := s.publish(ctx, next, pub.h.queue(m.ex), amqp.Publishing{
				MessageId: m.id, CorrelationId: m.corr, ContentType: "application/json",
				DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: m.body})
			if err != nil {
				_ = stopStream()
				return err
			}
		}
		if err := flush(); err != nil {
			_ = stopStream()
			return err
		}
		select {
		case <-ctx.Done():
			_ = stopStream()
			return ctx.Err()
		case <-tick.C:
		}
	}
	if err := stopStream(); err != nil {
		return err
	}
	pub.mu.Lock()
	pub.done = true
	pub.last = time.Now()
	for _, c := range pub.notify {
		close(c)
	}
	pub.mu.Unlock()
	return nil
}

// streamLoop publishes the stream messages handed over on q, every 100ms
// what has accumulated, until q is closed. A batch that fails or takes
// longer than streamCallTimeout (its node went, the stream is electing a
// leader) is published again, with the same creation times, until it is
// confirmed or ctx ends: copies it had stored are duplicates, the first of
// which sets the order's updated_at.
func (pub *publisher) streamLoop(ctx context.Context, q <-chan int) error {
	env, err := streamio.Open(ctx, streamio.Config{URI: pub.h.cfg.streamURL, Logger: pub.h.quiet})
	if err != nil {
		for range q { // keep the sender unblocked
		}
		return fmt.Errorf("publisher: %w", err)
	}
	defer env.Close()
	var batch []int
	send := func() error {
		if len(batch) == 0 {
			return nil
		}
		// The creation time is what the projection stores as updated_at:
		// milliseconds, as AMQP 1.0 timestamps carry.
		at := time.Now().Truncate(time.Millisecond)
		out := make([]streamio.Outgoing, len(batch))
		for j, i := range batch {
			m := pub.plan.msgs[i]
			out[j] = streamio.Outgoing{MessageID: m.id, Body: m.body, ContentType: "application/json", CreationTime: at}
		}
		for try := 1; ; try++ {
			tctx, cancel := context.WithTimeout(ctx, streamCallTimeout)
			err := env.Publish(tctx, pub.h.stream, out)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil || errors.Is(err, streamio.ErrAccessRefused) {
				return fmt.Errorf("publisher: %w", err)
			}
			pub.h.logf("publisher: %d stream messages not confirmed (try %d), publishing them again: %v", len(out), try, err)
			select {
			case <-ctx.Done():
				return fmt.Errorf("publisher: %w (last: %w)", ctx.Err(), err)
			case <-time.After(time.Second):
			}
		}
		for _, i := range batch {
			pub.sent(i, at)
		}
		batch = batch[:0]
		return nil
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var failed error
	for {
		select {
		case i, ok := <-q:
			if !ok {
				if failed == nil {
					failed = send()
				}
				return failed
			}
			batch = append(batch, i)
		case <-tick.C:
			if failed == nil {
				failed = send()
			}
		}
	}
}

// streamCallTimeout bounds one call of the soak's own to the stream
// protocol, confirms included.
const streamCallTimeout = 15 * time.Second

// sent records that message i was confirmed, sent at at.
func (pub *publisher) sent(i int, at time.Time) {
	m := pub.plan.msgs[i]
	pub.mu.Lock()
	defer pub.mu.Unlock()
	pub.sentAt[i] = at
	if m.probe {
		pub.probes[m.ex] = append(pub.probes[m.ex], probe{at: at, id: m.id})
		old := pub.notify[m.ex]
		pub.notify[m.ex] = make(chan struct{})
		close(old)
	}
}

// probeAfter waits for the first probe of ex sent after t0; ok is false if
// publishing ends (or ctx does) without one.
func (pub *publisher) probeAfter(ctx context.Context, ex example, t0 time.Time) (string, bool) {
	for {
		pub.mu.Lock()
		ps := pub.probes[ex]
		i := sort.Search(len(ps), func(i int) bool { return ps[i].at.After(t0) })
		if i < len(ps) {
			pub.mu.Unlock()
			return ps[i].id, true
		}
		if pub.done {
			pub.mu.Unlock()
			return "", false
		}
		wait := pub.notify[ex]
		pub.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-wait:
		}
	}
}

// finished returns when the last message was confirmed.
func (pub *publisher) finished() time.Time {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	return pub.last
}

// publishOne publishes one persistent message to queue and waits for the
// broker's confirm (the fault injector's messages, outside the plan).
func (h *harness) publishOne(ctx context.Context, queue, id string, body []byte) error {
	conn, _, err := amqpnodes.Dial(ctx, h.cfg.amqpURLs, amqp.Config{Properties: amqp.Table{"connection_name": "idem-soak-injector"}})
	if err != nil {
		return fmt.Errorf("injector: connect to rabbitmq: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("injector: channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("injector: confirm mode: %w", err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body})
	if err != nil {
		return fmt.Errorf("injector: publish %s: %w", id, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("injector: confirm %s: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("injector: the broker refused %s", id)
	}
	return nil
}
