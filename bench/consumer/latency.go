package main

import (
	"context"
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
	duration time.Duration // of publishing to idem
	sent     int
	commit   percentiles // publish → COMMIT returned
	received percentiles // publish → the runtime took the delivery (Message.ReceivedAt)
	own      percentiles // Message.ReceivedAt → COMMIT returned: idem's own part
	batches  int64
	// broker is the baseline, measured in segments that alternate with
	// idem's, at the same rate: a plain consumer of a quorum queue,
	// publish → delivery, no database.
	broker percentiles
	// naive is the second baseline, in the same segments: the naive
	// consumer (a transaction per message), publish → COMMIT returned.
	naive percentiles
	// ratios are, segment by segment, idem's p99 publish → commit over the
	// broker alone's p99 of the same round; naiveRatios the naive
	// consumer's.
	ratios, naiveRatios []float64
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

// latency offers o.latencyRate msg/s to an idem consumer and, as the
// baselines, to a plain consumer and to the naive consumer of other quorum
// queues, in o.latencyRounds rounds of segments that alternate (broker
// alone, naive, idem), so that a drift or a stall of the machine lands in
// all alike. Each consumer gets o.latencySeconds in all. Per message it
// measures publish → delivery (broker alone), publish → COMMIT returned
// (naive), and publish → received by the runtime and publish → COMMIT
// returned to the consumer (idem).
func (b *bench) latency(ctx context.Context) (latencyResult, error) {
	res := latencyResult{offered: b.o.latencyRate}
	total := b.o.latencyRate * b.o.latencySeconds
	rounds := max(min(b.o.latencyRounds, total), 1)
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

	alone, err := b.startBaseline(ctx, "latency-broker", total, nil)
	if err != nil {
		return res, fmt.Errorf("broker baseline: %w", err)
	}
	defer alone.close()
	naive, err := b.startBaseline(ctx, "latency-naive", total, b.naiveTx)
	if err != nil {
		return res, fmt.Errorf("naive baseline: %w", err)
	}
	defer naive.close()

	l, err := b.startLatencyIdem(ctx, pool, clock)
	if err != nil {
		return res, err
	}
	defer l.close()
	before := l.c.Stats().Batches
	samples := newLatencySamples(total)
	for p := range rounds {
		from, to := p*total/rounds, (p+1)*total/rounds
		if err := l.round(ctx, &res, samples, alone, naive, from, to); err != nil {
			return res, err
		}
	}
	res.sent, res.batches = total, l.c.Stats().Batches-before
	res.broker, res.naive, res.commit = percentilesOf(samples.broker), percentilesOf(samples.naive), percentilesOf(samples.commit)
	res.received, res.own = percentilesOf(samples.received), percentilesOf(samples.own)
	return res, nil
}

// latencySamples are the latency run's measures, one per message.
type latencySamples struct {
	broker, naive, commit, received, own []time.Duration
}

func newLatencySamples(total int) *latencySamples {
	return &latencySamples{
		broker: make([]time.Duration, 0, total), naive: make([]time.Duration, 0, total),
		commit: make([]time.Duration, 0, total), received: make([]time.Duration, 0, total),
		own: make([]time.Duration, 0, total),
	}
}

// latencyIdem is the idem consumer of the latency run, running, with the
// confirming channel that feeds its queue.
type latencyIdem struct {
	b       *bench
	q       string
	c       *consumer.Consumer
	r       *running
	ch      *amqp.Channel
	clock   *commitClock
	pending []*amqp.DeferredConfirmation
}

// startLatencyIdem declares the idem consumer's queue, starts the consumer
// with a handler that notes each message's times on clock, and runs the
// warm-up messages through it.
func (b *bench) startLatencyIdem(ctx context.Context, pool *pgxpool.Pool, clock *commitClock) (*latencyIdem, error) {
	q := b.queue("latency")
	c, _, err := b.newIdem(q, "bench-latency", true, false, pool)
	if err != nil {
		return nil, err
	}
	update := b.updateSQL
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(clock.noting(ctx, seqOf(m.Body), m.ReceivedAt), update, accountOf(m.Body))
		return err
	})
	if err := c.Declare(ctx); err != nil {
		return nil, err
	}
	ch, err := b.pub.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	l := &latencyIdem{b: b, q: q, c: c, r: start(ctx, c), ch: ch, clock: clock}
	for i := range warmup {
		if err := l.send(ctx, -1-i, time.Now()); err != nil {
			l.close()
			return nil, err
		}
	}
	if err := l.r.wait(ctx, warmup, time.Minute); err != nil {
		l.close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return l, nil
}

func (l *latencyIdem) close() {
	l.r.close()
	_ = l.ch.Close()
}

// send publishes message i; warm-up messages have negative i and are not
// measured (their sequence number is -1).
func (l *latencyIdem) send(ctx context.Context, i int, at time.Time) error {
	account, seq := i%l.b.o.accounts+1, int64(i)
	if i < 0 {
		account, seq = -i%l.b.o.accounts+1, -1
	}
	dc, err := l.ch.PublishWithDeferredConfirmWithContext(ctx, "", l.q, true, false, amqp.Publishing{
		MessageId: fmt.Sprintf("%s-latency-%d", l.b.runID, i), DeliveryMode: amqp.Persistent,
		Body: encode(account, seq, at)})
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	l.pending = append(l.pending, dc)
	return nil
}

// round runs messages [from, to) through the broker alone, the naive
// consumer and idem, in that order, and adds their measures to samples and
// the round's p99 ratios to res.
func (l *latencyIdem) round(ctx context.Context, res *latencyResult, samples *latencySamples,
	alone, naive *baseline, from, to int) error {
	delivered, err := alone.segment(ctx, from, to)
	if err != nil {
		return fmt.Errorf("broker baseline: %w", err)
	}
	samples.broker = append(samples.broker, delivered...)
	committed, err := naive.segment(ctx, from, to)
	if err != nil {
		return fmt.Errorf("naive baseline: %w", err)
	}
	samples.naive = append(samples.naive, committed...)

	start := time.Now()
	err = l.b.offer(ctx, to-from, func(i int) error {
		now := time.Now()
		l.clock.sent[from+i] = now.Sub(l.clock.base)
		return l.send(ctx, from+i, now)
	})
	if err != nil {
		return err
	}
	res.duration += time.Since(start)
	if err := waitConfirms(ctx, l.pending); err != nil {
		return err
	}
	l.pending = l.pending[:0]
	if err := l.r.wait(ctx, warmup+to, time.Minute); err != nil {
		return err
	}
	segment := make([]time.Duration, 0, to-from)
	for i := from; i < to; i++ {
		got, done := l.clock.receivedAt[i].Load(), l.clock.commitAt[i].Load()
		if got == 0 || done == 0 {
			return fmt.Errorf("message %d committed without a recorded receive or commit time", i)
		}
		samples.received = append(samples.received, time.Duration(got)-l.clock.sent[i])
		segment = append(segment, time.Duration(done)-l.clock.sent[i])
		samples.own = append(samples.own, time.Duration(done-got))
	}
	samples.commit = append(samples.commit, segment...)
	aloneP99 := float64(percentilesOf(delivered).p99)
	res.ratios = append(res.ratios, float64(percentilesOf(segment).p99)/aloneP99)
	res.naiveRatios = append(res.naiveRatios, float64(percentilesOf(committed).p99)/aloneP99)
	return nil
}

// baseline is one of the latency run's baselines: a consumer of a fresh
// quorum queue, without idem, fed the same schedule of persistent messages
// as idem (publisher confirms), that stamps each message when it is done
// with it, then acks it. The broker alone is done on delivery: what the
// broker and the machine cost before any consumer work. The naive consumer
// is done when its transaction (BEGIN; INSERT dedup; UPDATE; COMMIT)
// committed: what one transaction per message costs without idem.
type baseline struct {
	b    *bench
	name string
	q    string
	// work is the consumer's work on a delivery; nil for the broker alone.
	work   func(ctx context.Context, d *amqp.Delivery) error
	conn   *amqp.Connection
	ch     *amqp.Channel
	base   time.Time
	sent   []time.Duration // by sequence number; written by the publisher only
	done   []atomic.Int64  // nanoseconds since base; written by the consumer
	got    atomic.Int64    // messages done so far, warm-up included
	ids    atomic.Int64    // messages published
	failed chan error      // the consumer's end, if it failed
}

// startBaseline declares the queue, starts its consumer (doing work on
// each delivery, if not nil) and sends the warm-up messages through it.
func (b *bench) startBaseline(ctx context.Context, name string, total int, work func(context.Context, *amqp.Delivery) error) (*baseline, error) {
	l := &baseline{b: b, name: name, q: b.queue(name), work: work, base: time.Now(),
		sent: make([]time.Duration, total), done: make([]atomic.Int64, total), failed: make(chan error, 1)}
	if err := b.declareQuorum(l.q); err != nil {
		return nil, err
	}
	conn, deliveries, err := b.consume(l.q, "bench-"+name)
	if err != nil {
		return nil, err
	}
	l.conn = conn
	go func() { // owned: ends when conn closes (close), or when it fails
		for d := range deliveries {
			if l.work != nil {
				if err := l.work(ctx, &d); err != nil {
					l.failed <- err
					return
				}
			}
			if seq := seqOf(d.Body); seq >= 0 && seq < int64(total) {
				l.done[seq].Store(int64(time.Since(l.base)))
			}
			if err := d.Ack(false); err != nil {
				l.failed <- fmt.Errorf("ack: %w", err)
				return
			}
			l.got.Add(1)
		}
	}()
	if l.ch, err = b.pub.Channel(); err == nil {
		err = l.ch.Confirm(false)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	var pending []*amqp.DeferredConfirmation
	for range warmup {
		dc, err := l.publish(ctx, -1)
		if err != nil {
			l.close()
			return nil, err
		}
		pending = append(pending, dc)
	}
	if err := waitConfirms(ctx, pending); err != nil {
		l.close()
		return nil, err
	}
	if err := l.await(ctx, warmup); err != nil {
		l.close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return l, nil
}

func (l *baseline) close() {
	if l.ch != nil {
		_ = l.ch.Close()
	}
	_ = l.conn.Close()
}

func (l *baseline) publish(ctx context.Context, seq int64) (*amqp.DeferredConfirmation, error) {
	account := 1
	if seq >= 0 {
		account = int(seq)%l.b.o.accounts + 1
	}
	dc, err := l.ch.PublishWithDeferredConfirmWithContext(ctx, "", l.q, true, false, amqp.Publishing{
		MessageId: fmt.Sprintf("%s-%s-%d", l.b.runID, l.name, l.ids.Add(1)), DeliveryMode: amqp.Persistent,
		Body: encode(account, seq, time.Now())})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	return dc, nil
}

// await waits until the consumer is done with n messages in all, for at
// most a minute.
func (l *baseline) await(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for l.got.Load() < int64(n) {
		select {
		case err := <-l.failed:
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d messages: %w", l.name, l.got.Load(), n, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// segment offers messages from…to-1 at o.latencyRate and returns, once
// the consumer is done with them all, their publish → done times.
func (l *baseline) segment(ctx context.Context, from, to int) ([]time.Duration, error) {
	var pending []*amqp.DeferredConfirmation
	err := l.b.offer(ctx, to-from, func(i int) error {
		l.sent[from+i] = time.Since(l.base)
		dc, err := l.publish(ctx, int64(from+i))
		if err != nil {
			return err
		}
		pending = append(pending, dc)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := waitConfirms(ctx, pending); err != nil {
		return nil, err
	}
	if err := l.await(ctx, warmup+to); err != nil {
		return nil, err
	}
	got := make([]time.Duration, 0, to-from)
	for i := from; i < to; i++ {
		got = append(got, time.Duration(l.done[i].Load())-l.sent[i])
	}
	return got, nil
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
