package queuesource

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/engine"
)

// delivery is a message with what is needed to settle it.
type delivery struct {
	d  amqp.Delivery
	it *engine.Item
	s  *session
}

// routeBurst bounds the deliveries serve routes in a row before it looks at
// its other signals again (cancellation, a closed connection).
const routeBurst = 64

// serve consumes on session s until ctx is cancelled or the session dies.
// It owns the worker goroutines and the isolation goroutine, and returns
// only after they stopped; each of them ends within the handler timeout.
func (src *Source) serve(ctx context.Context, s *session) error {
	tag := fmt.Sprintf("%s-%d", src.cfg.ConnectionName, s.gen)
	sig := s.notifications()
	var deliveries <-chan amqp.Delivery
	err := src.brokerCall(ctx, s.sock, func() (err error) {
		deliveries, err = s.ch.Consume(src.cfg.Queue, tag, false, false, false, false, nil)
		return err
	})
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && (ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused) {
			return fmt.Errorf("%w: consume %s: %v", ErrFatal, src.cfg.Queue, err)
		}
		return fmt.Errorf("consume %s: %w", src.cfg.Queue, err)
	}
	src.eng.Vitals.Connected.Store(true)
	r := &router{src: src, s: s, suspects: make(chan *delivery, src.cfg.Prefetch)}
	r.inputs = make([]chan *delivery, 1)
	if r.key = src.cfg.OrderingKey; r.key == nil {
		r.key = src.cfg.AffinityKey
	}
	if r.key != nil {
		r.inputs = make([]chan *delivery, src.cfg.Workers)
	}
	for i := range r.inputs {
		r.inputs[i] = make(chan *delivery, src.cfg.Prefetch)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range src.cfg.Workers {
		in := r.inputs[w%len(r.inputs)]
		wg.Go(func() { src.worker(s, in, stop) })
	}
	wg.Go(func() { src.isolate(s, r.suspects, stop) })

	reason := r.loop(ctx, deliveries, sig)
	if ctx.Err() == nil || reason != nil {
		why := reason
		if why == nil { // loop stopped because the session was killed
			why = errSessionDied
		}
		s.kill(why) // cancels the handlers of this session's batches
	}
	close(stop)
	wg.Wait()
	src.finish(ctx, s, tag, deliveries)
	return reason
}

// finish ends a session whose batches are over. Acks still waiting behind
// deliveries that will never be settled on this channel (never started,
// left unacked) go out one by one while the channel works; what cannot be
// sent is counted. On shutdown the consumer is cancelled, synchronously.
func (src *Source) finish(ctx context.Context, s *session, tag string, deliveries <-chan amqp.Delivery) {
	s.gate.release() // what follows needs the broker's answers
	go func() {      // owned: ends when the session's connection closes
		for range deliveries { // left unacked: the broker requeues them on close
		}
	}()
	if !s.ch.IsClosed() {
		if err := s.acks.flush(); err != nil {
			src.cfg.Logger.Warn("acking at the end of the session failed; the broker redelivers what was not acked",
				"consumer", src.cfg.Name, "error", err)
		}
	}
	if n := s.acks.unsent(); n > 0 {
		src.dropAcks(ctx, n)
	}
	if s.alive() {
		// Shutdown: the in-flight batches are acked; now cancel the
		// consumer. The order matters on RabbitMQ 3.10 quorum queues: acks
		// that arrive after basic.cancel are ignored, and acks still pending
		// in the channel when the connection closes are lost, while a
		// cancel-ok confirms the acks before it. The wait for cancel-ok is
		// bounded by CommitTimeout (ctx has ended: shutdown).
		err := src.brokerCall(context.WithoutCancel(ctx), s.sock, func() error { return s.ch.Cancel(tag, false) })
		if err != nil {
			src.cfg.Logger.Warn("cancelling the consumer at shutdown failed; the broker redelivers what was not acked",
				"consumer", src.cfg.Name, "error", err)
		}
	}
}

// router hands deliveries to the workers, and suspects to the isolation
// goroutine.
type router struct {
	src      *Source
	s        *session
	key      func(*engine.Item) string // routes to inputs; nil with one input
	inputs   []chan *delivery
	suspects chan *delivery
}

// signals are the session's notifications of its end.
type signals struct {
	connClosed, chClosed, pubConnClosed, pubClosed <-chan *amqp.Error
	// cancelled is closed (with no value) whenever ch closes.
	cancelled <-chan string
}

// notifications registers for the session's end. Register before the
// session is used: the client closes a notification registered on a
// channel or connection already closed without saying why.
func (s *session) notifications() signals {
	return signals{
		connClosed:    s.conn.NotifyClose(make(chan *amqp.Error, 1)),
		chClosed:      s.ch.NotifyClose(make(chan *amqp.Error, 1)),
		pubConnClosed: s.pubConn.NotifyClose(make(chan *amqp.Error, 1)),
		pubClosed:     s.pub.ch.NotifyClose(make(chan *amqp.Error, 1)),
		cancelled:     s.ch.NotifyCancel(make(chan string, 1)),
	}
}

// loop routes deliveries until ctx ends or the session dies, and says why
// it stopped (nil on shutdown).
func (r *router) loop(ctx context.Context, deliveries <-chan amqp.Delivery, sig signals) error {
	s := r.s
	cancelled := sig.cancelled
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-sig.connClosed:
			return fmt.Errorf("connection closed: %v", e)
		case e := <-sig.chClosed:
			return fmt.Errorf("channel closed: %v", e)
		case e := <-sig.pubConnClosed:
			return fmt.Errorf("publish connection closed: %v", e)
		case e := <-sig.pubClosed:
			return fmt.Errorf("publish channel closed: %v", e)
		case _, ok := <-cancelled:
			if !ok {
				// The client closes it whenever the AMQP channel or
				// connection closes: the close notifications say why.
				cancelled = nil
				continue
			}
			return fmt.Errorf("broker cancelled the consumer of %s (queue deleted?)", r.src.cfg.Queue)
		case <-s.dead:
			return fmt.Errorf("session ended: %w", s.why)
		case d, ok := <-deliveries:
			routed, stop, err := r.burst(ctx, d, ok, deliveries, sig)
			r.src.eng.Telemetry().Consumed(context.Background(), routed)
			if stop {
				return err
			}
		}
	}
}

// burst routes d and up to routeBurst deliveries already buffered behind it,
// taken with cheap non-blocking receives (the select in loop waits for the
// next one), and returns how many it routed; stop ends the loop with err.
func (r *router) burst(ctx context.Context, d amqp.Delivery, ok bool, deliveries <-chan amqp.Delivery, sig signals) (routed int, stop bool, err error) {
	s := r.s
	for {
		if !ok {
			return routed, true, closedWhy(sig)
		}
		routed++
		if !r.route(ctx, d) {
			if !s.alive() {
				return routed, true, fmt.Errorf("session ended: %w", s.why)
			}
			return routed, true, nil
		}
		if routed > routeBurst || ctx.Err() != nil || !s.alive() {
			return routed, false, nil // look at the other signals again
		}
		select {
		case d, ok = <-deliveries:
		default:
			return routed, false, nil
		}
	}
}

// closedWhy is why the delivery channel closed: the client closes it when
// the AMQP channel or connection closes, after it queued the broker's reason
// in their close notifications.
func closedWhy(sig signals) error {
	select {
	case e := <-sig.connClosed:
		return fmt.Errorf("connection closed: %v", e)
	case e := <-sig.chClosed:
		return fmt.Errorf("channel closed: %v", e)
	default:
		return errors.New("delivery channel closed")
	}
}

// route hands d to the isolation goroutine if the broker delivered it before
// (it may have killed its worker), else to its worker: the only one, or the
// one its ordering (or affinity) key hashes to. It returns false if ctx ended or the
// session died first.
func (r *router) route(ctx context.Context, d amqp.Delivery) bool {
	src, s := r.src, r.s
	s.acks.deliver(d.DeliveryTag) // before any later delivery can be settled
	s.gate.take(len(d.Body))
	src.held.Store(s.gate.heldBytes())
	dv := &delivery{d: d, s: s, it: src.cfg.Prepare(&d, time.Now())}
	dv.it.DeliveryTag = d.DeliveryTag
	if dv.it.Suspect = isSuspect(&d); dv.it.Suspect {
		src.eng.Telemetry().Redelivered(ctx)
	}
	dv.it.Returned = cameBackFrom(d.Headers, src.cfg.RetryQueue)
	in := r.suspects
	if !dv.it.Suspect {
		in = r.inputs[0]
		if len(r.inputs) > 1 {
			h := fnv.New32a()
			h.Write([]byte(r.key(dv.it)))
			in = r.inputs[h.Sum32()%uint32(len(r.inputs))]
		}
	}
	select {
	case in <- dv: // the common case: room in the input
		return true
	default:
	}
	select {
	case in <- dv:
		return true
	case <-ctx.Done():
		return false
	case <-s.dead:
		return false
	}
}

// isSuspect reports a delivery the broker made before: redelivered, or
// counted by a quorum queue.
func isSuspect(d *amqp.Delivery) bool {
	n, _ := HeaderInt(d.Headers, "x-delivery-count")
	return d.Redelivered || n > 0
}

// cameBackFrom reports whether the delivery's x-death names queue: it came
// back from the retry queue. A publisher can forge the header; it only makes
// the engine read the attempts table, which a publisher cannot write.
func cameBackFrom(h amqp.Table, queue string) bool {
	deaths, _ := h["x-death"].([]any)
	for _, d := range deaths {
		if t, ok := d.(amqp.Table); ok && t["queue"] == queue {
			return true
		}
	}
	return false
}

// worker takes batches from in and runs them until stop is closed. A batch
// is what is already buffered, up to BatchMaxSize; when more than one message
// is waiting it waits up to BatchMaxWait for the batch to fill.
func (src *Source) worker(s *session, in <-chan *delivery, stop <-chan struct{}) {
	batch := make([]*delivery, 0, src.cfg.BatchMaxSize)
	var carry []*delivery // postponed by the last batch: they run in this one
	var timer *time.Timer
	for {
		// Reused arrays must not keep old deliveries (their bodies) alive.
		clear(batch[:cap(batch)])
		batch = append(batch[:0], carry...)
		clear(carry)
		carry = carry[:0]
		if len(batch) == 0 {
			select {
			case <-stop:
				return
			case d := <-in:
				batch = append(batch, d)
			}
		}
		size := src.batchLimit()
	drain:
		for len(batch) < size {
			select {
			case d := <-in:
				batch = append(batch, d)
			default:
				break drain
			}
		}
		if len(batch) > 1 && len(batch) < size && src.cfg.BatchMaxWait > 0 {
			if timer == nil {
				timer = time.NewTimer(src.cfg.BatchMaxWait)
			} else {
				timer.Reset(src.cfg.BatchMaxWait)
			}
		fill:
			for len(batch) < size {
				select {
				case d := <-in:
					batch = append(batch, d)
				case <-timer.C:
					break fill
				case <-stop:
					break fill
				}
			}
			timer.Stop()
		}
		select {
		case <-stop:
			return // not started: left unacked for redelivery
		default:
		}
		carry = src.runBatch(s, batch, carry)
	}
}

// batchLimit is the most messages a worker takes into one batch.
func (src *Source) batchLimit() int { return src.cfg.BatchMaxSize }

// runBatch runs a batch from one session and settles it with the broker;
// the messages the batch postponed are appended to carry, for the next one.
func (src *Source) runBatch(s *session, batch, carry []*delivery) []*delivery {
	items := make([]*engine.Item, len(batch))
	for i, d := range batch {
		items[i] = d.it
	}
	o := src.options(s)
	o.Postpone = src.cfg.OrderingKey == nil // postponing reorders: not with ordering keys
	results := src.eng.Run(s.ctx, items, o)
	settled, done, postponed := batch[:0:0], results[:0:0], results[:0:0]
	for i, r := range results {
		if r.Outcome == engine.Postponed {
			carry = append(carry, batch[i])
			postponed = append(postponed, r)
			continue
		}
		settled, done = append(settled, batch[i]), append(done, r)
	}
	if len(postponed) > 0 {
		src.eng.Count(s.ctx, postponed)
	}
	src.settle(s.ctx, s, settled, done)
	return carry
}

func (src *Source) options(s *session) engine.Options {
	return engine.Options{TrackAttempts: true, Abandon: s.dead, AfterCommit: src.cfg.AfterCommit}
}

// isolate runs suspects one at a time, each alone (engine.RunAlone), until
// stop is closed.
func (src *Source) isolate(s *session, suspects <-chan *delivery, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case d := <-suspects:
			select {
			case <-stop:
				return // not started: left unacked for redelivery
			default:
			}
			r := src.eng.RunAlone(s.ctx, d.it, src.options(s))
			src.settle(s.ctx, s, []*delivery{d}, []engine.Result{r})
		}
	}
}

// HeaderInt reads an integer header of any AMQP integer type; other types
// (a string x-delivery-count, say) are ignored rather than trusted.
func HeaderInt(h amqp.Table, key string) (int64, bool) {
	switch v := h[key].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	default:
		return 0, false
	}
}
