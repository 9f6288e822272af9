package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/consumer"
)

// warmup messages are processed before the measured ones, so that
// connecting and the first prepared statements are not measured.
const warmup = 50

// latencyResult is the outcome of the latency run.
type latencyResult struct {
	offered  int           // msg/s
	duration time.Duration // of publishing
	sent     int
	commit   percentiles // publish → COMMIT returned
	received percentiles // publish → the runtime took the delivery (Message.ReceivedAt)
	own      percentiles // Message.ReceivedAt → COMMIT returned: idem's own part
	batches  int64
	// broker is the baseline measured just before, at the same rate: a
	// plain consumer of a quorum queue, publish → delivery, no database.
	broker percentiles
}

type percentiles struct{ p50, p90, p99, max time.Duration }

func percentilesOf(d []time.Duration) percentiles {
	slices.Sort(d)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(d))+0.999999) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	return percentiles{p50: at(0.50), p90: at(0.90), p99: at(0.99), max: d[len(d)-1]}
}

// commitClock records when each message's transaction committed. It is a
// pgx QueryTracer on the consumer's pool: the handler sends its UPDATE with
// a context that names the message (noting), the tracer notes the message
// on the statement's connection, and when a COMMIT on that connection
// returns without error every message noted since the BEGIN gets the time;
// a ROLLBACK or the next BEGIN forgets them (their batch will run again).
// The handler does not take the raw connection (tx.Conn()): the runtime
// checks the transaction of a handler that does, which costs a round trip.
type commitClock struct {
	base       time.Time
	sent       []time.Duration // by sequence number; written by the publisher only
	receivedAt []atomic.Int64  // nanoseconds since base; 0: not yet
	commitAt   []atomic.Int64

	mu   sync.Mutex
	open map[*pgx.Conn][]int64
}

func newCommitClock(n int) *commitClock {
	return &commitClock{base: time.Now(), sent: make([]time.Duration, n),
		receivedAt: make([]atomic.Int64, n), commitAt: make([]atomic.Int64, n), open: map[*pgx.Conn][]int64{}}
}

func (k *commitClock) since() int64 { return int64(time.Since(k.base)) }

// noted is the context key of the message a handler's statement runs for.
type noted struct{}

// noting returns ctx naming message seq, which the runtime received at
// received: a statement sent with it notes the message on its connection.
func (k *commitClock) noting(ctx context.Context, seq int64, received time.Time) context.Context {
	if seq < 0 || seq >= int64(len(k.sent)) {
		return ctx // a warm-up message
	}
	k.receivedAt[seq].CompareAndSwap(0, int64(received.Sub(k.base)))
	return context.WithValue(ctx, noted{}, seq)
}

// TraceQueryStart implements pgx.QueryTracer.
func (k *commitClock) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if seq, ok := ctx.Value(noted{}).(int64); ok {
		k.mu.Lock()
		k.open[conn] = append(k.open[conn], seq)
		k.mu.Unlock()
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (k *commitClock) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	switch data.CommandTag.String() {
	case "COMMIT":
		if data.Err != nil {
			return
		}
		now := k.since()
		k.mu.Lock()
		for _, seq := range k.open[conn] {
			k.commitAt[seq].CompareAndSwap(0, now)
		}
		delete(k.open, conn)
		k.mu.Unlock()
	case "BEGIN", "ROLLBACK":
		k.mu.Lock()
		delete(k.open, conn)
		k.mu.Unlock()
	}
}

// latency offers o.latencyRate msg/s to an idem consumer for
// o.latencySeconds and measures, per message, publish → received by the runtime and
// publish → COMMIT returned to the consumer.
func (b *bench) latency(ctx context.Context) (latencyResult, error) {
	res := latencyResult{offered: b.o.latencyRate}
	total := b.o.latencyRate * b.o.latencySeconds
	clock := newCommitClock(total)
	cfg, err := pgxpool.ParseConfig(b.o.pgURL)
	if err != nil {
		return res, err
	}
	cfg.ConnConfig.Tracer = clock
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()

	// Write back what earlier work left dirty now, so that a checkpoint it
	// would trigger does not land in the middle of the measurement and
	// charge its fsyncs to it.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.logf("latency: CHECKPOINT failed (%v); measuring anyway", err)
	}

	if res.broker, err = b.brokerLatency(ctx); err != nil {
		return res, fmt.Errorf("broker baseline: %w", err)
	}

	q := b.queue("latency")
	c, _, err := b.newIdem(q, "bench-latency", true, false, pool)
	if err != nil {
		return res, err
	}
	update := b.updateSQL
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(clock.noting(ctx, seqOf(m.Body), m.ReceivedAt), update, accountOf(m.Body))
		return err
	})
	if err := c.Declare(ctx); err != nil {
		return res, err
	}
	ch, err := b.pub.Channel()
	if err != nil {
		return res, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return res, err
	}

	r := start(ctx, c)
	defer r.close()

	var pending []*amqp.DeferredConfirmation
	// send publishes message i; warm-up messages have negative i and are not
	// measured (their sequence number is -1).
	send := func(i int, at time.Time) error {
		account, seq := i%b.o.accounts+1, int64(i)
		if i < 0 {
			account, seq = -i%b.o.accounts+1, -1
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-latency-%d", b.runID, i), DeliveryMode: amqp.Persistent,
			Body: encode(account, seq, at)})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
		return nil
	}
	for i := range warmup {
		if err := send(-1-i, time.Now()); err != nil {
			return res, err
		}
	}
	if err := r.wait(ctx, warmup, time.Minute); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}

	before := c.Stats().Batches
	start := time.Now()
	err = b.offer(ctx, total, func(i int) error {
		now := time.Now()
		clock.sent[i] = now.Sub(clock.base)
		return send(i, now)
	})
	if err != nil {
		return res, err
	}
	res.duration, res.sent = time.Since(start), total
	if err := waitConfirms(ctx, pending); err != nil {
		return res, err
	}
	if err := r.wait(ctx, warmup+total, time.Minute); err != nil {
		return res, err
	}
	res.batches = c.Stats().Batches - before

	commit := make([]time.Duration, 0, total)
	received := make([]time.Duration, 0, total)
	own := make([]time.Duration, 0, total)
	for i := range total {
		r, k := clock.receivedAt[i].Load(), clock.commitAt[i].Load()
		if r == 0 || k == 0 {
			return res, fmt.Errorf("message %d committed without a recorded receive or commit time", i)
		}
		received = append(received, time.Duration(r)-clock.sent[i])
		commit = append(commit, time.Duration(k)-clock.sent[i])
		own = append(own, time.Duration(k-r))
	}
	res.commit, res.received, res.own = percentilesOf(commit), percentilesOf(received), percentilesOf(own)
	return res, nil
}

// brokerLatency is the latency run's baseline: the same schedule of
// persistent messages (warm-up, then o.latencyRate msg/s for
// o.latencySeconds, publisher confirms) to a fresh quorum queue, consumed by
// a plain consumer that acks each delivery; per message, publish →
// delivery. What the broker and the machine cost before idem does anything.
func (b *bench) brokerLatency(ctx context.Context) (percentiles, error) {
	q := b.queue("latency-broker")
	if err := b.declareQuorum(q); err != nil {
		return percentiles{}, err
	}
	conn, deliveries, err := b.consume(q, "bench-latency-broker")
	if err != nil {
		return percentiles{}, err
	}
	defer conn.Close()
	ch, err := b.pub.Channel()
	if err != nil {
		return percentiles{}, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return percentiles{}, err
	}
	total := b.o.latencyRate * b.o.latencySeconds
	base := time.Now()
	sent := make([]time.Duration, total)     // written by the publisher
	received := make([]time.Duration, total) // written by the consumer until done
	done := make(chan error, 1)
	go func() { // owned: ends after warmup+total deliveries, or when conn closes
		for n := 0; n < warmup+total; n++ {
			d, ok := <-deliveries
			if !ok {
				done <- errors.New("delivery channel closed")
				return
			}
			if seq := seqOf(d.Body); seq >= 0 && seq < int64(total) {
				received[seq] = time.Since(base)
			}
			if err := d.Ack(false); err != nil {
				done <- fmt.Errorf("ack: %w", err)
				return
			}
		}
		done <- nil
	}()
	var pending []*amqp.DeferredConfirmation
	send := func(seq int64) error {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-latency-broker-%d", b.runID, seq), DeliveryMode: amqp.Persistent,
			Body: encode(1, seq, time.Now())})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
		return nil
	}
	for range warmup {
		if err := send(-1); err != nil {
			return percentiles{}, err
		}
	}
	err = b.offer(ctx, total, func(i int) error {
		sent[i] = time.Since(base)
		return send(int64(i))
	})
	if err != nil {
		return percentiles{}, err
	}
	if err := waitConfirms(ctx, pending); err != nil {
		return percentiles{}, err
	}
	select {
	case err := <-done:
		if err != nil {
			return percentiles{}, err
		}
	case <-time.After(time.Minute):
		return percentiles{}, errors.New("deliveries did not arrive within a minute")
	}
	got := make([]time.Duration, total)
	for i := range total {
		got[i] = received[i] - sent[i]
	}
	return percentilesOf(got), nil
}

// offer calls send for 0…total-1 at o.latencyRate per second, on a fixed
// schedule from the first call (a late send does not delay the next ones).
func (b *bench) offer(ctx context.Context, total int, send func(i int) error) error {
	interval := time.Second / time.Duration(b.o.latencyRate)
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := send(i); err != nil {
			return err
		}
	}
	return nil
}

// waitConfirms waits until the broker confirmed every publish in pending.
func waitConfirms(ctx context.Context, pending []*amqp.DeferredConfirmation) error {
	for _, dc := range pending {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish: confirmed=%v: %v", ok, err)
		}
	}
	return nil
}
