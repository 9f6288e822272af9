package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/partitions"
)

// dupDelay is how many events after the first copy a duplicate is published.
const dupDelay = 50

// event is one account's seq-th event.
type event struct{ account, seq int }

// events is the sequence a publisher sends: accounts drawn at random from a
// fixed seed (every drain of a run sees the same sequence), each account's
// events numbered from 1, and a share -dup of them published again
// dupDelay events later.
type events struct {
	rng      *rand.Rand
	dup      float64
	next     []int // each account's last seq
	pending  []dupOf
	sent     int // events taken so far, duplicates included
	distinct int
}

// dupOf is a duplicate waiting for its turn.
type dupOf struct {
	e   event
	due int
}

func newEvents(o options, seed uint64) *events {
	return &events{rng: rand.New(rand.NewPCG(seed, 7)), dup: o.dup, next: make([]int, o.accounts)}
}

// take returns the next event to publish.
func (s *events) take() event {
	s.sent++
	if len(s.pending) > 0 && s.pending[0].due <= s.sent {
		e := s.pending[0].e
		s.pending = s.pending[1:]
		return e
	}
	a := s.rng.IntN(len(s.next))
	s.next[a]++
	e := event{a, s.next[a]}
	s.distinct++
	if s.rng.Float64() < s.dup {
		s.pending = append(s.pending, dupOf{e, s.sent + dupDelay})
	}
	return e
}

// rest returns the duplicates not yet published.
func (s *events) rest() []event {
	var out []event
	for _, p := range s.pending {
		out = append(out, p.e)
	}
	s.pending = nil
	return out
}

// topology is a consumer's queues: partitions (and their exchange) or one
// queue.
type topology struct {
	o     options
	queue string
	parts int
}

// declare declares the consumer q's topology with parts partitions (0: one
// queue), as its workers will.
func (b *bench) declare(ctx context.Context, q string, parts int) (*topology, error) {
	t := &topology{o: b.o, queue: q, parts: parts}
	c, err := consumer.New(consumer.Config{Name: q, Pool: b.pool, Queue: q, AMQPURL: b.o.amqpURL, Tables: b.tables,
		Workers: 1, Partitions: parts, OrderingKey: func(m *consumer.Message) string { return "" }})
	if err != nil {
		return nil, err
	}
	if err := c.Declare(ctx); err != nil {
		t.remove()
		return nil, err
	}
	return t, nil
}

// queues are the queues messages are consumed from.
func (t *topology) queues() []string {
	if t.parts == 0 {
		return []string{t.queue}
	}
	var out []string
	for i := range t.parts {
		out = append(out, partitions.QueueName(t.queue, i))
	}
	return out
}

// ready is the number of messages ready in the consumed queues.
func (t *topology) ready() (int, error) {
	conn, err := amqp.Dial(t.o.amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, q := range t.queues() {
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return 0, err
		}
		n += st.Messages
	}
	return n, nil
}

// remove deletes the queues, their retry queues, the dead-letter queue and
// the exchange.
func (t *topology) remove() {
	conn, err := amqp.Dial(t.o.amqpURL)
	if err != nil {
		logf("remove %s: %v", t.queue, err)
		return
	}
	defer conn.Close()
	for _, q := range amqpnames.Queues(t.queue, t.parts) {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	if t.parts > 0 {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(t.queue, false, false)
			_ = ch.Close()
		}
	}
}

// publisher publishes events to a consumer's topology with partitions.Publish
// (the account as routing key), persistent, with publisher confirms.
type publisher struct {
	t        *topology
	conn     *amqp.Connection
	ch       *amqp.Channel
	returned atomic.Int64 // messages the broker could not route
}

func newPublisher(o options, t *topology) (*publisher, error) {
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return nil, err
	}
	p := &publisher{t: t, conn: conn}
	if p.ch, err = conn.Channel(); err == nil {
		err = p.ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	returns := p.ch.NotifyReturn(make(chan amqp.Return, 16))
	go func() { // owned by p: ends when the channel closes
		for range returns {
			p.returned.Add(1)
		}
	}()
	return p, nil
}

func (p *publisher) close() { _ = p.conn.Close() }

func (p *publisher) publish(ctx context.Context, e event) (*amqp.DeferredConfirmation, error) {
	key := strconv.Itoa(e.account)
	return partitions.Publish(ctx, p.ch, p.t.queue, p.t.parts, key, amqp.Publishing{
		MessageId: fmt.Sprintf("%d/%d", e.account, e.seq), Body: encode(e.account, e.seq), DeliveryMode: amqp.Persistent})
}

// publishBatch publishes es and waits for their confirms.
func (p *publisher) publishBatch(ctx context.Context, es []event) error {
	pending := make([]*amqp.DeferredConfirmation, 0, len(es))
	for _, e := range es {
		dc, err := p.publish(ctx, e)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish not confirmed: %v", err)
		}
	}
	if n := p.returned.Load(); n > 0 {
		return fmt.Errorf("%d events returned unroutable", n)
	}
	return nil
}

// publishAll publishes o.n distinct events of s and their duplicates, a
// thousand confirms at a time.
func (p *publisher) publishAll(ctx context.Context, s *events) error {
	batch := make([]event, 0, 1000)
	for s.distinct < p.t.o.n {
		batch = append(batch, s.take())
		if len(batch) == cap(batch) {
			if err := p.publishBatch(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return p.publishBatch(ctx, append(batch, s.rest()...))
}

// publishAt publishes events of s at rate per second until stop is closed,
// then the duplicates still due, and returns how many distinct events it
// published.
func (p *publisher) publishAt(ctx context.Context, s *events, rate int, stop <-chan struct{}) (int, error) {
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-stop:
			return s.distinct, p.publishBatch(ctx, s.rest())
		case <-ctx.Done():
			return s.distinct, ctx.Err()
		case now := <-t.C:
			due := int(now.Sub(start).Seconds()*float64(rate)) - s.sent
			var batch []event
			for range max(due, 0) {
				batch = append(batch, s.take())
			}
			if err := p.publishBatch(ctx, batch); err != nil {
				return s.distinct, err
			}
		}
	}
}
