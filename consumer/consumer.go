// Package consumer is idem's runtime: it consumes a RabbitMQ queue with
// manual acks, runs each handler inside a PostgreSQL transaction that first
// claims the message in the inbox, commits, and only then acks. Duplicates are
// acked without running the handler, payload conflicts and undecodable
// messages are dead-lettered with a reason, and failures are retried with
// backoff through a retry queue.
//
// Messages are batched: the deliveries already buffered run in one
// transaction, a savepoint each, so one commit serves many messages while a
// failing handler rolls back only its own work.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/inbox"
)

// Consumer runs a Handler over a queue. Create it with New, register the
// handler with Handle, then call Run.
type Consumer struct {
	cfg     Config
	inbox   *inbox.Inbox
	tel     *telemetry
	handler Handler
	batch   BatchHandler
	source  string // the queue or stream name
	running atomic.Bool
	gen     atomic.Uint64
	counts  counters

	// checkpoint and tail are the stream source's last committed offset and
	// the stream's last sampled tail, for the lag metric.
	checkpoint, tail atomic.Int64

	// careful counts down the batches that run with savepoints after a
	// handler failed in an optimistic batch.
	careful atomic.Int64
	// classicClaims counts down the batches that claim with ClaimBatch
	// after a batch claimed with ClaimNewBatch met a duplicate.
	classicClaims atomic.Int64

	// parallel admits batches: shared normally, exclusive while batches
	// contend (see admit); serialUntil is when that ends (Unix ns).
	parallel    sync.RWMutex
	serialUntil atomic.Int64

	// afterCommit, when set by tests of this package, runs after each
	// successful commit and before the acks: the crash window of invariant 2.
	afterCommit func()
}

// New validates cfg, fills in defaults and returns a Consumer. It does not
// connect: Run does, and Run needs AMQPURL and Queue; Process needs neither.
func New(cfg Config) (*Consumer, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	source := cfg.Queue
	if cfg.Stream != "" {
		source = cfg.Stream
	}
	if source == "" {
		source = cfg.Name
	}
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables, MaxIDBytes: cfg.MaxIDBytes})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c := &Consumer{cfg: cfg, inbox: ib, source: source}
	c.tel, err = newTelemetry(&cfg, source, c.lag)
	if err != nil {
		return nil, fmt.Errorf("consumer: telemetry: %w", err)
	}
	return c, nil
}

// lag is the stream lag: the sampled tail offset minus the checkpoint.
func (c *Consumer) lag() (int64, bool) {
	if c.cfg.Stream == "" || c.tail.Load() == 0 && c.checkpoint.Load() == 0 {
		return 0, false
	}
	return max(c.tail.Load()-c.checkpoint.Load(), 0), true
}

// Handle sets the handler. Call it once, before Run.
func (c *Consumer) Handle(h Handler) { c.handler = h }

// HandleBatch sets an optional handler that processes all of a batch's new
// messages at once — a projection written with one set-based statement
// instead of one per message. It must have the same effect as Handle's
// handler run on each message in order. When it fails, the batch runs again
// message by message with Handle's handler, a savepoint each, so that each
// failure is attributed to its message; Handle is therefore still required.
// Read-only (forensic) and repair batches always run message by message.
func (c *Consumer) HandleBatch(h BatchHandler) { c.batch = h }

// Config returns the configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// Run consumes until ctx is cancelled, reconnecting (with capped exponential
// backoff) whenever the connection or a channel dies. On cancellation it
// stops consuming, lets in-flight batches commit and ack (on a context
// detached from ctx, bounded by ShutdownTimeout), leaves deliveries that were
// never started unacked for the next consumer, closes, and returns nil.
// It returns an error only for problems reconnecting cannot fix.
func (c *Consumer) Run(ctx context.Context) error {
	if c.handler == nil {
		return configError("no handler: call Handle before Run")
	}
	if (c.cfg.Queue == "") == (c.cfg.Stream == "") {
		return configError("Run needs exactly one of Queue and Stream")
	}
	if c.cfg.Queue != "" && c.cfg.AMQPURL == "" {
		return configError("Run needs AMQPURL to consume a queue")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run is already running")
	}
	defer c.running.Store(false)
	if c.cfg.Stream != "" {
		return c.runStream(ctx)
	}

	work, stopWork := shutdownContext(ctx, c.cfg.ShutdownTimeout)
	defer stopWork()

	log := c.cfg.Logger.With("consumer", c.cfg.Name, "queue", c.cfg.Queue)
	for failures := 0; ; {
		s, err := c.connect(c.gen.Add(1))
		if err != nil {
			if errors.Is(err, errFatal) {
				return err
			}
			failures++
			delay := backoff(failures, 100*time.Millisecond, c.cfg.ReconnectMaxDelay)
			log.Warn("broker unavailable, retrying", "error", err, "retry_in", delay)
			if !sleep(ctx, delay) {
				return nil
			}
			continue
		}
		if failures > 0 || s.gen > 1 {
			c.tel.reconnect(ctx)
			c.counts.reconnects.Add(1)
			log.Info("connected to broker", "generation", s.gen, "url", redactURL(c.cfg.AMQPURL))
		}
		failures = 0
		err = c.serve(ctx, work, s)
		s.close()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errFatal) {
			return err
		}
		log.Warn("broker connection lost, reconnecting", "error", err, "generation", s.gen)
		if !sleep(ctx, backoff(1, 100*time.Millisecond, c.cfg.ReconnectMaxDelay)) {
			return nil
		}
	}
}

// shutdownContext returns a context for in-flight work: it ignores ctx's
// cancellation for grace, then is cancelled too. stop releases its timer.
func shutdownContext(ctx context.Context, grace time.Duration) (context.Context, func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(grace, cancel)
		mu.Unlock()
	})
	return work, func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// delivery is a message with the broker handle needed to settle it.
type delivery struct {
	msg *Message
	tag uint64
	s   *session
}

// serve consumes on session s until ctx is cancelled or the session dies.
// It owns the worker goroutines and returns only after they stopped.
func (c *Consumer) serve(ctx, work context.Context, s *session) error {
	tag := fmt.Sprintf("%s-%d", c.cfg.ConnectionName, s.gen)
	deliveries, err := s.ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && (ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused) {
			return fmt.Errorf("%w: consume %s: %v", errFatal, c.cfg.Queue, err)
		}
		return fmt.Errorf("consume %s: %w", c.cfg.Queue, err)
	}
	connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := s.ch.NotifyClose(make(chan *amqp.Error, 1))
	pubClosed := s.pub.ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := s.ch.NotifyCancel(make(chan string, 1))

	inputs := make([]chan *delivery, 1)
	if c.cfg.OrderingKey != nil {
		inputs = make([]chan *delivery, c.cfg.Workers)
	}
	for i := range inputs {
		inputs[i] = make(chan *delivery, c.cfg.Prefetch)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < c.cfg.Workers; w++ {
		wg.Add(1)
		go func(in <-chan *delivery) {
			defer wg.Done()
			c.worker(work, in, stop)
		}(inputs[w%len(inputs)])
	}

	var reason error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case e := <-connClosed:
			reason = fmt.Errorf("connection closed: %v", e)
			break loop
		case e := <-chClosed:
			reason = fmt.Errorf("channel closed: %v", e)
			break loop
		case e := <-pubClosed:
			reason = fmt.Errorf("publish channel closed: %v", e)
			break loop
		case <-cancelled:
			reason = fmt.Errorf("broker cancelled the consumer of %s (queue deleted?)", c.cfg.Queue)
			break loop
		case <-s.dead:
			reason = errors.New("session abandoned")
			break loop
		case d, ok := <-deliveries:
			// Route this delivery and up to a burst of those already
			// buffered behind it with cheap non-blocking receives; the
			// select over every signal above waits for the next one.
			for n := 0; ; n++ {
				if !ok {
					reason = errors.New("delivery channel closed")
					break loop
				}
				if !c.route(ctx, s, inputs, d) {
					break loop
				}
				if n == routeBurst || ctx.Err() != nil || !s.alive() {
					break // look at the other signals again
				}
				select {
				case d, ok = <-deliveries:
					continue
				default:
				}
				break // nothing buffered: wait in the select above
			}
		}
	}
	if ctx.Err() == nil || reason != nil {
		s.kill()
	}
	close(stop)
	wg.Wait()
	// The batches are over. Acks still waiting behind deliveries that will
	// never be settled on this channel (never started, left unacked) go out
	// one by one while the channel works; what cannot be sent is counted.
	if !s.ch.IsClosed() {
		if err := s.acks.flush(); err != nil {
			c.cfg.Logger.Warn("acking at the end of the session failed; the broker redelivers what was not acked",
				"consumer", c.cfg.Name, "error", err)
		}
	}
	if n := s.acks.unsent(); n > 0 {
		c.dropAcks(ctx, n)
	}
	if s.alive() {
		// Shutdown: the in-flight batches are acked; now cancel the
		// consumer, synchronously. The order matters on RabbitMQ 3.10 quorum
		// queues: acks that arrive after basic.cancel are ignored, and acks
		// still pending in the channel when the connection closes are lost,
		// while a cancel-ok confirms the acks before it. What is still
		// buffered stays unacked and returns to the queue on close.
		_ = s.ch.Cancel(tag, false)
	}
	return reason
}

// worker takes batches from in and runs them until stop is closed. A batch
// is what is already buffered, up to BatchMaxSize; when more than one message
// is waiting it waits up to BatchMaxWait for the batch to fill.
func (c *Consumer) worker(ctx context.Context, in <-chan *delivery, stop <-chan struct{}) {
	batch := make([]*delivery, 0, c.cfg.BatchMaxSize)
	var timer *time.Timer
	for {
		batch = batch[:0]
		select {
		case <-stop:
			return
		case d := <-in:
			batch = append(batch, d)
		}
	drain:
		for len(batch) < c.cfg.BatchMaxSize {
			select {
			case d := <-in:
				batch = append(batch, d)
			default:
				break drain
			}
		}
		if len(batch) > 1 && len(batch) < c.cfg.BatchMaxSize && c.cfg.BatchMaxWait > 0 {
			if timer == nil {
				timer = time.NewTimer(c.cfg.BatchMaxWait)
			} else {
				timer.Reset(c.cfg.BatchMaxWait)
			}
		fill:
			for len(batch) < c.cfg.BatchMaxSize {
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
		c.handleBatch(ctx, batch)
	}
}

// handleBatch processes a batch from one session and settles it with the broker.
func (c *Consumer) handleBatch(ctx context.Context, batch []*delivery) {
	s := batch[0].s
	msgs := make([]*Message, len(batch))
	for i, d := range batch {
		msgs[i] = d.msg
	}
	hooks := batchOptions{afterCommit: c.afterCommit, abandon: s.dead}
	results := c.runBatch(ctx, msgs, hooks)
	c.settle(ctx, s, batch, results)
}

// routeBurst bounds the deliveries serve routes in a row before it looks at
// its other signals again (cancellation, a closed connection).
const routeBurst = 64

// route hands d to its worker's input: the only one, or the one its
// ordering key hashes to. It returns false if ctx ended first.
func (c *Consumer) route(ctx context.Context, s *session, inputs []chan *delivery, d amqp.Delivery) bool {
	s.acks.deliver(d.DeliveryTag) // before any later delivery can be settled
	dv := c.fromDelivery(d, s, time.Now())
	in := inputs[0]
	if len(inputs) > 1 {
		h := fnv.New32a()
		h.Write([]byte(c.cfg.OrderingKey(dv.msg)))
		in = inputs[h.Sum32()%uint32(len(inputs))]
	}
	select {
	case in <- dv: // the common case: room in the input, no need to watch ctx
		return true
	default:
	}
	select {
	case in <- dv:
		return true
	case <-ctx.Done():
		return false
	}
}

// fromDelivery turns an AMQP delivery into a Message.
func (c *Consumer) fromDelivery(d amqp.Delivery, s *session, received time.Time) *delivery {
	m := &Message{
		Body:          d.Body,
		Headers:       map[string]any(d.Headers),
		ContentType:   d.ContentType,
		CorrelationID: d.CorrelationId,
		Exchange:      d.Exchange,
		RoutingKey:    d.RoutingKey,
		Redelivered:   d.Redelivered,
		Attempt:       1,
		Source:        c.cfg.Queue,
		Timestamp:     d.Timestamp,
		ReceivedAt:    received,
	}
	if m.Headers == nil {
		m.Headers = map[string]any{}
	}
	if n, ok := headerInt(d.Headers, "x-delivery-count"); ok && n >= 0 {
		m.DeliveryCount = n
	}
	if n, ok := headerInt(d.Headers, headerAttempt); ok && n > 1 && n < 1<<20 {
		m.Attempt = int(n)
	}
	if ex, ok := d.Headers[headerOriginalExchange].(string); ok {
		m.Exchange = ex
	}
	if key, ok := d.Headers[headerOriginalKey].(string); ok {
		m.RoutingKey = key
	}
	c.prepare(m, d.MessageId)
	return &delivery{msg: m, tag: d.DeliveryTag, s: s}
}

// settle tells the broker what became of each message, after the batch's
// transaction committed: ack processed and duplicate messages; publish dead
// letters and retries with confirms, then ack them; hand unresolved ones
// back. Acks for a dead session are dropped (the broker redelivers, and the
// inbox turns the redelivery into a duplicate).
func (c *Consumer) settle(ctx context.Context, s *session, batch []*delivery, results []result) {
	var out []outgoing
	var outIdx []int
	counts := map[string]int{}
	for i, r := range results {
		m := batch[i].msg
		counts[outcomeName(r)]++
		switch r.outcome {
		case outcomeDeadLettered:
			c.logDeadLetter(m, r)
			out = append(out, c.deadLetterMessage(m, r))
			outIdx = append(outIdx, i)
		case outcomeRetry:
			delay := backoff(m.Attempt, c.cfg.RetryBaseDelay, c.cfg.RetryMaxDelay)
			c.cfg.Logger.Info("handler failed, retrying", "consumer", c.cfg.Name, "message_id", shortID(m.ID),
				"attempt", m.Attempt, "retry_in", delay, "error", errorText(r.err))
			out = append(out, c.retryMessage(m, r, delay))
			outIdx = append(outIdx, i)
		}
	}
	for name, n := range counts {
		c.tel.outcome(ctx, name, n)
	}
	defer c.counts.count(results) // once the broker has been told
	if !s.alive() {
		c.dropAcks(ctx, len(batch))
		return
	}
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	stored := make([]bool, len(batch))
	for i, r := range results {
		stored[i] = r.outcome == outcomeProcessed || r.outcome == outcomeDuplicate
	}
	unroutable := false
	if len(out) > 0 {
		ok, err := s.pub.publishAll(settleCtx, out)
		if err != nil {
			c.cfg.Logger.Error("publishing dead letters and retries failed; leaving them for redelivery",
				"consumer", c.cfg.Name, "error", err)
		}
		failed := 0
		for j, i := range outIdx {
			stored[i] = ok[j]
			if !ok[j] {
				failed++
			}
		}
		unroutable = failed > 0 && err == nil
		if unroutable {
			// Unroutable: the retry or dead-letter queue is gone. Leave the
			// messages unacked and reconnect, which declares the topology
			// again (Topology Declare); requeueing them at once would only
			// dead-letter them again into the void.
			c.cfg.Logger.Error("retry or dead-letter queue unroutable; reconnecting to declare it again",
				"consumer", c.cfg.Name, "messages", failed, "retry_queue", c.cfg.RetryQueue, "dead_letter_queue", c.cfg.DeadLetterQueue)
			defer s.kill()
		}
	}
	acks := make([]uint64, 0, len(batch))
	var nacks []uint64
	for i, d := range batch {
		switch {
		case stored[i]:
			acks = append(acks, d.tag)
		case unroutable:
			// left unacked: the session ends and the broker requeues it
		default:
			nacks = append(nacks, d.tag)
		}
	}
	if !s.alive() {
		c.dropAcks(ctx, len(batch))
		return
	}
	err := s.acks.settle(acks, nacks)
	if err == nil && unroutable {
		// The session ends: no ack may wait for the tags left unacked,
		// this batch's or, from now on, another worker's.
		err = s.acks.flush()
	}
	if err != nil {
		// serve counts the acks that were not sent when the session ends.
		c.cfg.Logger.Warn("acking failed; the broker redelivers what was not acked",
			"consumer", c.cfg.Name, "error", err)
		s.kill()
	}
}

// outcomeName is the outcome attribute of the messages metric.
func outcomeName(r result) string {
	if r.outcome == outcomeDeadLettered && r.reason == ReasonPayloadConflict {
		return "conflict"
	}
	return r.outcome.String()
}

// logDeadLetter logs why m is dead-lettered; conflicts loudly, with both hashes.
func (c *Consumer) logDeadLetter(m *Message, r result) {
	if r.reason == ReasonPayloadConflict {
		c.cfg.Logger.Error("payload conflict: message id reused with a different payload",
			"consumer", c.cfg.Name, "message_id", shortID(m.ID),
			"payload_hash", m.Hash.String(), "stored_hash", r.storedHash.String())
		return
	}
	c.cfg.Logger.Warn("dead-lettering message", "consumer", c.cfg.Name,
		"message_id", shortID(m.ID), "reason", r.reason, "error", errorText(r.err))
}

// dropAcks counts n settlements skipped because the session died.
func (c *Consumer) dropAcks(ctx context.Context, n int) {
	c.tel.ackDropped(ctx, n)
	c.counts.acksDropped.Add(int64(n))
}

// deadLetterMessage is the copy of m published to the dead-letter queue.
func (c *Consumer) deadLetterMessage(m *Message, r result) outgoing {
	p := c.republish(m)
	p.Headers[headerReason] = r.reason
	p.Headers[headerError] = truncate(errorText(r.err), 1024)
	p.Headers[headerConsumer] = c.cfg.Name
	p.Headers[headerAttempts] = int64(m.Attempt)
	p.Headers[headerPayloadHash] = m.Hash.String()
	if !r.storedHash.IsZero() {
		p.Headers[headerStoredHash] = r.storedHash.String()
	}
	return outgoing{queue: c.cfg.DeadLetterQueue, msg: p}
}

// retryMessage is the copy of m parked in the retry queue for delay; the
// queue's dead-letter route brings it back when it expires.
func (c *Consumer) retryMessage(m *Message, r result, delay time.Duration) outgoing {
	p := c.republish(m)
	p.Headers[headerAttempt] = int64(m.Attempt + 1)
	p.Headers[headerError] = truncate(errorText(r.err), 1024)
	p.Expiration = strconv.FormatInt(max(delay.Milliseconds(), 1), 10)
	return outgoing{queue: c.cfg.RetryQueue, msg: p}
}

// republish copies m's properties and headers for publishing it again.
func (c *Consumer) republish(m *Message) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[headerOriginalExchange] = m.Exchange
	headers[headerOriginalKey] = m.RoutingKey
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   m.ContentType,
		CorrelationId: m.CorrelationID,
		MessageId:     m.rawID,
		Timestamp:     m.Timestamp,
		DeliveryMode:  amqp.Persistent,
		Body:          m.Body,
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
