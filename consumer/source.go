package consumer

// The queue source: it consumes with manual acks, builds each delivery's
// Message, routes deliveries to batch workers (by ordering key when there
// is one), runs redelivered messages alone, and settles each batch with the
// broker after it committed — acks, nacks, and confirmed publishes to the
// retry and dead-letter queues. It reconnects with backoff, keeps every
// delivery tied to the session that delivered it, and bounds in bytes what
// it holds in memory.
//
// A message's path through it is three rooms: source.go (the session loop,
// receiving and routing, the workers' batches), window.go (taken into the
// window of unsettled deliveries; settled out of it), and, only when it
// fails, copies.go (its retry or dead-letter copy) or, with an ordering
// key, hold.go (held in its worker, with its key, until its retry).
// session.go dials and publishes, topology.go declares, partitioned.go runs
// one queueSource per partition this process holds.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/amqpurl"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
)

// queueSource consumes one queue, or one partition of a partitioned queue,
// into the engine. It reads the consumer's Config directly: an option of
// the queue is declared, defaulted and checked in config.go and read here.
type queueSource struct {
	cfg Config // a partition's names its partition's queues (see partitionedSource.partition)
	// nodes are the broker's URLs (Config.AMQPURL or AMQPURLs): each
	// session dials them in a shuffled order and keeps the first that
	// answers.
	nodes []string
	// exchange is set for a partition: the consistent-hash exchange
	// (Config.Queue) its queue is bound to. Its queue is declared with a
	// single active consumer.
	exchange string
	// orderingKey keeps messages with one key on one worker, in order:
	// Config.OrderingKey, or with Partitions the routing key.
	orderingKey func(*Message) string
	// affinityKey, set when orderingKey is not, sends messages with one key
	// to one worker, so that concurrent batches rarely write the same rows;
	// it keeps no order (a postponed message runs later).
	affinityKey func(*Message) string
	eng         *engine.Engine
	policy      engine.Queue // the queue's policy, but its Abandon, which is per session
	gen         atomic.Uint64
	// held is the gate's account of the current session, for Stats.
	held atomic.Int64
	// connected reports that a session consumes; alone, a queueSource
	// reports it in the engine's vitals too (a partitionedSource sums its
	// partitions').
	connected atomic.Bool
	// changed, when set (a partition's queueSource), is told of each change
	// of connected, instead of the engine's vitals.
	changed func()
}

// setConnected records whether a session consumes.
func (src *queueSource) setConnected(ok bool) {
	src.connected.Store(ok)
	if src.changed != nil {
		src.changed()
		return
	}
	src.eng.Vitals.Connected.Store(ok)
}

// newQueueSource returns a queueSource of cfg's Queue feeding eng;
// afterCommit, when set (tests), runs after each commit, before the acks.
func newQueueSource(cfg Config, eng *engine.Engine, afterCommit func()) *queueSource {
	ordering := cfg.orderingKey()
	return &queueSource{cfg: cfg, nodes: cfg.nodes(), orderingKey: ordering, affinityKey: cfg.affinityKey(), eng: eng,
		policy: engine.Queue{Ordered: ordering != nil, AfterCommit: afterCommit}}
}

// BufferedBytes is what the current session holds in memory of deliveries
// not yet settled.
func (src *queueSource) BufferedBytes() int64 { return src.held.Load() }

// Run consumes until ctx is cancelled, reconnecting (with capped exponential
// backoff) whenever a connection or a channel dies. On cancellation it stops
// consuming, lets the batches in flight commit and settle (on a context
// detached from ctx, bounded by ShutdownTimeout), leaves deliveries that were
// never started unacked for the next consumer, closes, and returns nil. It
// returns an error wrapping errFatal for what reconnecting cannot fix.
//
// The backoff runs across sessions: a failed connect and a session that
// ended without doing any good (see session.worked) both count as a failure,
// so a session that the same cause ends as soon as it starts (a dead-letter
// queue that refuses every dead letter) is retried ever more slowly, up to
// ReconnectMaxDelay. After a session that worked, the next attempt waits as
// after a first failure.
func (src *queueSource) Run(ctx context.Context) (err error) {
	stopped := src.eng.Started(ctx)
	defer func() { stopped(err) }()
	return src.consume(ctx)
}

// consume is Run without marking the engine started and stopped: a
// partitioned consumer runs one queueSource per partition it holds, under one
// start (see partitionedSource).
func (src *queueSource) consume(ctx context.Context) error {
	vitals := &src.eng.Vitals
	work, stopWork := engine.ShutdownContext(ctx, src.cfg.ShutdownTimeout)
	defer stopWork()
	log := src.cfg.Logger.With("consumer", src.cfg.Name, "queue", src.cfg.Queue)
	tel := src.eng.Telemetry()
	for failures := 0; ; {
		s, err := src.connect(ctx, work, src.gen.Add(1))
		if err != nil {
			if errors.Is(err, errFatal) {
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
		log.Info("broker session started", "generation", s.gen, "url", amqpurl.Redact(s.node),
			"prefetch", src.cfg.Prefetch, "max_buffered_bytes", src.cfg.MaxBufferedBytes)
		vitals.SetTrouble("")
		started := time.Now()
		err = src.serve(ctx, s)
		src.setConnected(false)
		if err != nil {
			vitals.SetTrouble("broker session ended: " + err.Error())
			if ctx.Err() == nil {
				s.abandon()
			}
		}
		s.close()
		if ctx.Err() != nil {
			log.Info("broker session ended: shutdown", "generation", s.gen)
			return nil
		}
		if errors.Is(err, errFatal) {
			log.Error("broker session ended; not retrying", "generation", s.gen, "error", err)
			return err
		}
		amqpconn.Suspect(s.node) // the next session dials the other nodes first
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
func (src *queueSource) Declare(ctx context.Context) error { return declareAll(ctx, src) }

// declareAll connects once, with the first source's configuration, and
// sets up the topology of each source (see queueSource.declare), each broker
// call bounded by CommitTimeout and ctx. What redeclaring cannot fix wraps
// errFatal.
func declareAll(ctx context.Context, sources ...*queueSource) error {
	src := sources[0]
	conn, sock, _, err := src.dial(ctx, src.cfg.ConnectionName, nil, src.nodes)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(closeTimeout)) }()
	var ch *amqp.Channel
	if err := src.brokerCall(ctx, sock, func() (err error) { ch, err = conn.Channel(); return err }); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	for _, s := range sources {
		if err := src.brokerCall(ctx, sock, func() (err error) { ch, err = s.declare(conn, ch); return err }); err != nil {
			if fatal(err) {
				return fmt.Errorf("%w: topology: %v", errFatal, err)
			}
			return fmt.Errorf("topology: %w", err)
		}
	}
	return ctx.Err()
}

// delivery is a message with what is needed to settle it.
type delivery struct {
	d  amqp.Delivery
	it *engine.Item
	s  *session
	// unresolved counts its batches in a row that did not commit while a
	// keyHold held it.
	unresolved int
}

// routeBurst bounds the deliveries serve routes in a row before it looks at
// its other signals again (cancellation, a closed connection).
const routeBurst = 64

// serve consumes on session s until ctx is cancelled or the session dies.
// It owns the worker goroutines and the isolation goroutine, and returns
// only after they stopped; each of them ends within the handler timeout.
func (src *queueSource) serve(ctx context.Context, s *session) error {
	tag := fmt.Sprintf("%s-%d", src.cfg.ConnectionName, s.gen)
	sig := s.notifications()
	var deliveries <-chan amqp.Delivery
	err := src.brokerCall(ctx, s.sock, func() (err error) {
		deliveries, err = s.ch.Consume(src.cfg.Queue, tag, false, false, false, false, nil)
		return err
	})
	if err != nil {
		if fatal(err) {
			return fmt.Errorf("%w: consume %s: %v", errFatal, src.cfg.Queue, err)
		}
		return fmt.Errorf("consume %s: %w", src.cfg.Queue, err)
	}
	src.setConnected(true)
	r := &router{src: src, s: s, suspects: make(chan *delivery, src.cfg.Prefetch)}
	r.inputs = make([]chan *delivery, 1)
	if r.key = src.orderingKey; r.key == nil {
		r.key = src.affinityKey
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
// sent is counted. On shutdown the consumer of a queue is cancelled,
// synchronously; a partition's is not (see below).
func (src *queueSource) finish(ctx context.Context, s *session, tag string, deliveries <-chan amqp.Delivery) {
	s.gate.Release() // what follows needs the broker's answers
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
	if s.alive() && src.exchange == "" {
		// Shutdown: the in-flight batches are acked; now cancel the
		// consumer. The order matters on RabbitMQ 3.10 quorum queues: acks
		// that arrive after basic.cancel are ignored, and acks still pending
		// in the channel when the connection closes are lost, while a
		// cancel-ok confirms the acks before it. The wait for cancel-ok is
		// bounded by CommitTimeout (ctx has ended: shutdown).
		//
		// A partition (a single active consumer) is handed over instead by
		// closing the connection. A cancel would activate the next consumer
		// at once, while the deliveries this one never started stay checked
		// out to its channel until it closes: the next consumer would get a
		// key's later messages before them. Closing returns them to the
		// head of the queue before the next consumer is activated; an ack
		// the close loses brings its message back there too, as a duplicate
		// the inbox skips, in order.
		err := src.brokerCall(context.WithoutCancel(ctx), s.sock, func() error { return s.ch.Cancel(tag, false) })
		if err != nil {
			src.cfg.Logger.Warn("cancelling the consumer at shutdown failed; the broker redelivers what was not acked",
				"consumer", src.cfg.Name, "error", err)
		}
	}
}

// router hands deliveries to the workers, and suspects to the isolation
// goroutine (with an ordering key, to their key's worker: see route).
type router struct {
	src      *queueSource
	s        *session
	key      func(*idem.Message) string // routes to inputs; nil with one input
	inputs   []chan *delivery
	suspects chan *delivery
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
			if _, stop, err := r.burst(ctx, d, ok, deliveries, sig); stop {
				return err
			}
		}
	}
}

// burst takes d and up to routeBurst deliveries already buffered behind it
// (cheap non-blocking receives; the select in loop waits for the next one)
// into the window, prepares their messages at once, and routes them; it
// returns how many it took. stop ends the loop with err.
func (r *router) burst(ctx context.Context, d amqp.Delivery, ok bool, deliveries <-chan amqp.Delivery, sig signals) (taken int, stop bool, err error) {
	s := r.s
	received := time.Now()
	ds := make([]amqp.Delivery, 0, 8)
	for more := ok; more; {
		s.take(r.src, &d) // before any later delivery can be settled
		ds = append(ds, d)
		if len(ds) > routeBurst {
			break
		}
		select {
		case d, ok = <-deliveries:
			more = ok
		default:
			more = false
		}
	}
	msgs := make([]idem.Message, len(ds))
	for i := range ds {
		r.src.message(&ds[i], received, &msgs[i])
	}
	for i, it := range r.src.eng.PrepareAll(msgs) {
		s.screened(it, &ds[i])
		if !r.route(ctx, &delivery{d: ds[i], s: s, it: it}) {
			if !s.alive() {
				return len(ds), true, fmt.Errorf("session ended: %w", s.why)
			}
			return len(ds), true, nil
		}
	}
	if !ok {
		return len(ds), true, closedWhy(sig)
	}
	return len(ds), false, nil
}

// message builds the idem.Message of delivery d, received at received.
func (src *queueSource) message(d *amqp.Delivery, received time.Time, m *idem.Message) {
	*m = idem.Message{
		MessageID: d.MessageId, Body: d.Body, Headers: map[string]any(d.Headers), ContentType: d.ContentType,
		CorrelationID: d.CorrelationId, Exchange: d.Exchange, RoutingKey: d.RoutingKey,
		Redelivered: d.Redelivered, Attempt: 1, Source: src.cfg.Queue, Timestamp: d.Timestamp, ReceivedAt: received,
	}
	if n, ok := headerInt(d.Headers, "x-delivery-count"); ok && n >= 0 {
		m.DeliveryCount = n
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

// route hands dv to the isolation goroutine if the broker delivered it
// before (it may have killed its worker), else to its worker: the only one,
// or the one its ordering (or affinity) key hashes to. It returns false if
// ctx ended or the session died first.
func (r *router) route(ctx context.Context, dv *delivery) bool {
	src, s := r.src, r.s
	dv.it.DeliveryTag = dv.d.DeliveryTag
	if dv.it.Suspect = isSuspect(&dv.d); dv.it.Suspect {
		src.eng.Telemetry().Redelivered(ctx)
	}
	dv.it.Returned = cameBackFrom(dv.d.Headers, src.cfg.RetryQueue)
	if src.orderingKey != nil {
		dv.it.Key = src.orderingKey(dv.it.Message) // a failed message holds its key (see keyHold)
	}
	in := r.suspects
	// With an ordering key a redelivery goes to its key's worker like the
	// key's other messages, which runs it alone in its place (see
	// runInOrder): run apart, it could be overtaken by a later message of
	// its key.
	if !dv.it.Suspect || src.orderingKey != nil {
		in = r.inputs[0]
		if len(r.inputs) > 1 {
			key := dv.it.Key
			if src.orderingKey == nil {
				key = r.key(dv.it.Message)
			}
			h := fnv.New32a()
			h.Write([]byte(key))
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

// isSuspect reports a delivery the broker made before: its redelivered
// flag, which only the broker sets. A quorum queue's x-delivery-count is
// not read here: a publisher can set that header on a first delivery (the
// queue adds it only once it counts a return), and would make every message
// run alone.
func isSuspect(d *amqp.Delivery) bool { return d.Redelivered }

// cameBackFrom reports whether the delivery's x-death names queue: it came
// back from the retry queue. A publisher can forge the header; it only makes
// the engine read the attempts table, which a publisher cannot write.
func cameBackFrom(h amqp.Table, queue string) bool {
	return slices.ContainsFunc(amqpnames.Deaths(h), func(d amqpnames.Death) bool { return d.Queue == queue })
}

// worker takes batches from in and runs them until stop is closed. A batch
// is what is already buffered, up to BatchMaxSize; when more than one message
// is waiting it waits up to BatchMaxWait for the batch to fill. With an
// ordering key, a delivery whose key is held behind a failed message waits
// in the worker's keyHold instead, and what the hold releases goes first.
func (src *queueSource) worker(s *session, in <-chan *delivery, stop <-chan struct{}) {
	batch := make([]*delivery, 0, src.cfg.BatchMaxSize)
	var carry []*delivery // postponed by the last batch: they run in this one
	var timer *time.Timer
	h := src.newKeyHold(s) // nil without an ordering key
	defer h.stop()
	for {
		// Reused arrays must not keep old deliveries (their bodies) alive.
		clear(batch[:cap(batch)])
		batch = append(batch[:0], carry...)
		clear(carry)
		carry = carry[:0]
		size := src.batchLimit()
		var wake <-chan time.Time
		if h != nil {
			batch, wake = h.take(batch, size), h.wake()
		}
		if len(batch) == 0 {
			select {
			case <-stop:
				return
			case <-wake:
				continue
			case d := <-in:
				if batch = add(batch, d, h); len(batch) == 0 {
					continue
				}
			}
		}
	drain:
		for len(batch) < size {
			select {
			case d := <-in:
				batch = add(batch, d, h)
			default:
				break drain
			}
		}
		if len(batch) > 1 && len(batch) < size && src.cfg.BatchMaxWait > 0 {
			batch = src.fill(batch, size, in, stop, h, &timer)
		}
		select {
		case <-stop:
			return // not started: left unacked for redelivery
		default:
		}
		carry = src.runInOrder(s, batch, carry, stop, h)
	}
}

// fill waits up to BatchMaxWait for batch to fill up to size.
func (src *queueSource) fill(batch []*delivery, size int, in <-chan *delivery, stop <-chan struct{}, h *keyHold, timer **time.Timer) []*delivery {
	if *timer == nil {
		*timer = time.NewTimer(src.cfg.BatchMaxWait)
	} else {
		(*timer).Reset(src.cfg.BatchMaxWait)
	}
	defer (*timer).Stop()
	for len(batch) < size {
		select {
		case d := <-in:
			batch = add(batch, d, h)
		case <-(*timer).C:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}

// add appends d to batch, unless h (with an ordering key) holds its key:
// then d waits behind the key's failed message.
func add(batch []*delivery, d *delivery, h *keyHold) []*delivery {
	if h != nil && h.add(d) {
		return batch
	}
	return append(batch, d)
}

// runInOrder runs batch: with an ordering key a worker receives its keys'
// redeliveries too (see router.route), and runs each alone in its place:
// the messages before it as a batch, then it alone (a redelivery may be a
// poison message that killed a worker), then the rest, without the
// deliveries of a key held by what ran before them (see keyHold). Segments
// not started when stop closes are left unacked for redelivery.
func (src *queueSource) runInOrder(s *session, batch, carry []*delivery, stop <-chan struct{}, h *keyHold) []*delivery {
	if h != nil {
		defer h.sweep()
	}
	for len(batch) > 0 {
		i := slices.IndexFunc(batch, func(d *delivery) bool { return d.it.Suspect })
		if i < 0 {
			return src.runBatch(s, batch, carry, h)
		}
		if i > 0 {
			carry = src.runBatch(s, batch[:i], carry, h)
		}
		select {
		case <-stop:
			return carry
		default:
		}
		if h != nil {
			if batch = h.divert(batch[i:]); len(batch) == 0 || !batch[0].it.Suspect {
				continue
			}
			i = 0
		}
		src.runAlone(s, batch[i], h)
		batch = batch[i+1:]
		if h != nil {
			batch = h.divert(batch)
		}
	}
	return carry
}

// batchLimit is the most messages a worker takes into one batch.
func (src *queueSource) batchLimit() int { return src.cfg.BatchMaxSize }

// runBatch runs a batch from one session and settles it with the broker;
// the messages the batch postponed are appended to carry, for the next one.
// With an ordering key, h keeps what the batch did not settle.
func (src *queueSource) runBatch(s *session, batch, carry []*delivery, h *keyHold) []*delivery {
	items := make([]*engine.Item, len(batch))
	for i, d := range batch {
		items[i] = d.it
	}
	results := src.eng.Run(s.ctx, items, src.sessionPolicy(s))
	if h != nil {
		batch, results = h.keep(s.ctx, batch, results)
	}
	settled, done, postponed := batch[:0:0], results[:0:0], results[:0:0]
	for i, r := range results {
		if r.Outcome == idem.Postponed {
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

// sessionPolicy is the queue's policy for the batches of session s: their
// retries stop when it dies.
func (src *queueSource) sessionPolicy(s *session) engine.Queue {
	p := src.policy
	p.Abandon = s.dead
	return p
}

// isolate runs suspects one at a time, each alone (engine.RunAlone), until
// stop is closed. Without an ordering key, nothing orders a suspect after
// the messages around it.
func (src *queueSource) isolate(s *session, suspects <-chan *delivery, stop <-chan struct{}) {
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
			src.runAlone(s, d, nil)
		}
	}
}

// runAlone runs one suspected delivery alone (engine.RunAlone) and settles
// it; with an ordering key, h keeps it if it did not settle.
func (src *queueSource) runAlone(s *session, d *delivery, h *keyHold) {
	batch, results := []*delivery{d}, []engine.Result{src.eng.RunAlone(s.ctx, d.it, src.sessionPolicy(s))}
	if h != nil {
		batch, results = h.keep(s.ctx, batch, results)
	}
	src.settle(s.ctx, s, batch, results)
}

// headerInt reads an integer header of any AMQP integer type; other types
// (a string x-delivery-count, say) are ignored rather than trusted.
func headerInt(h amqp.Table, key string) (int64, bool) {
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
