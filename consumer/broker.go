package consumer

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one broker connection with its consume channel and its
// confirm-mode publish channel. Deliveries remember their session: an ack is
// sent only on the channel that delivered the message, and only while that
// session is alive; after a reconnect, delivery tags restart at 1 on the new
// channel, so an old tag must never be acked there (invariant 7).
type session struct {
	gen  uint64
	conn *amqp.Connection
	ch   *amqp.Channel
	pub  *publisher
	acks *acker // settles ch's deliveries
	dead chan struct{}
	once sync.Once
}

func (s *session) kill() { s.once.Do(func() { close(s.dead) }) }

func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}

func (s *session) close() {
	s.kill()
	_ = s.conn.Close()
}

// errFatal marks broker errors that reconnecting cannot fix (wrong queue
// arguments, access refused): Run returns them.
var errFatal = errors.New("consumer: fatal broker error")

// redactURL hides the password of an AMQP URL for logs and errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	return u.Redacted()
}

// connect dials the broker and sets up channels and topology.
func (c *Consumer) connect(gen uint64) (*session, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.cfg.ConnectionName)
	conn, err := amqp.DialConfig(c.cfg.AMQPURL, amqp.Config{
		Properties: props,
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: dial %s: %w", redactURL(c.cfg.AMQPURL), err)
	}
	s := &session{gen: gen, conn: conn, dead: make(chan struct{})}
	fail := func(what string, err error) (*session, error) {
		_ = conn.Close()
		var ae *amqp.Error
		if errors.As(err, &ae) && (ae.Code == amqp.PreconditionFailed || ae.Code == amqp.AccessRefused || ae.Code == amqp.NotFound) {
			return nil, fmt.Errorf("%w: %s: %v", errFatal, what, err)
		}
		return nil, fmt.Errorf("consumer: %s: %w", what, err)
	}
	if s.ch, err = conn.Channel(); err != nil {
		return fail("open channel", err)
	}
	if err := c.declare(s.ch); err != nil {
		return fail("topology", err)
	}
	if err := s.ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fail("qos", err)
	}
	s.acks = newAcker(s.ch, c.cfg.Prefetch)
	pch, err := conn.Channel()
	if err != nil {
		return fail("open publish channel", err)
	}
	if err := pch.Confirm(false); err != nil {
		return fail("confirm mode", err)
	}
	s.pub = &publisher{ch: pch, returns: pch.NotifyReturn(make(chan amqp.Return, 2*publishChunk))}
	return s, nil
}

// declare sets up the queue, the retry queue (whose expired messages flow
// back to the queue) and the dead-letter queue, as Config.Topology says.
func (c *Consumer) declare(ch *amqp.Channel) error {
	mainArgs := amqp.Table{
		"x-queue-type":              c.cfg.QueueType,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": c.cfg.DeadLetterQueue,
	}
	if c.cfg.QueueType == "quorum" {
		// Backstop for poison messages that crash the worker before it can
		// decide: the broker dead-letters them (x-death reason delivery_limit).
		mainArgs["x-delivery-limit"] = int64(c.cfg.DeliveryLimit)
	}
	queues := []struct {
		name string
		args amqp.Table
	}{
		{c.cfg.Queue, mainArgs},
		{c.cfg.RetryQueue, amqp.Table{
			"x-queue-type":              "classic",
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": c.cfg.Queue,
		}},
		{c.cfg.DeadLetterQueue, amqp.Table{"x-queue-type": c.cfg.QueueType}},
	}
	for _, q := range queues {
		var err error
		switch c.cfg.Topology {
		case Declare:
			_, err = ch.QueueDeclare(q.name, true, false, false, false, q.args)
		case Passive:
			_, err = ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
		default:
			return nil
		}
		if err != nil {
			return fmt.Errorf("queue %s: %w", q.name, err)
		}
	}
	return nil
}

// publisher publishes with publisher confirms and the mandatory flag on a
// dedicated channel. A publish counts as stored only when the broker acked it
// and did not return it as unroutable.
type publisher struct {
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
	seq     atomic.Uint64
}

// publishIDHeader correlates a returned message with its publish.
const publishIDHeader = "x-idem-publish-id"

// outgoing is one message to publish to a queue through the default exchange.
type outgoing struct {
	queue string
	msg   amqp.Publishing
}

// publishChunk bounds the publishes awaiting confirms at once, so that the
// returns of a chunk always fit the returns channel (the client drops a
// return it cannot deliver within 5 s, which would pass for stored).
const publishChunk = 512

// publishAll publishes every message and waits for the confirms; ok[i]
// reports whether message i is safely stored in its queue.
func (p *publisher) publishAll(ctx context.Context, out []outgoing) (ok []bool, err error) {
	ok = make([]bool, 0, len(out))
	for len(out) > 0 {
		n := min(len(out), publishChunk)
		part, err := p.publishChunk(ctx, out[:n])
		ok = append(ok, part...)
		if err != nil {
			return append(ok, make([]bool, len(out)-n)...), err
		}
		out = out[n:]
	}
	return ok, nil
}

// publishChunk publishes at most publishChunk messages; see publishAll.
func (p *publisher) publishChunk(ctx context.Context, out []outgoing) (ok []bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok = make([]bool, len(out))
	confirms := make([]*amqp.DeferredConfirmation, len(out))
	ids := make(map[string]int, len(out))
	for i, o := range out {
		id := strconv.FormatUint(p.seq.Add(1), 10)
		headers := amqp.Table{}
		for k, v := range o.msg.Headers {
			headers[k] = v
		}
		headers[publishIDHeader] = id
		o.msg.Headers = headers
		ids[id] = i
		confirms[i], err = p.ch.PublishWithDeferredConfirmWithContext(ctx, "", o.queue, true, false, o.msg)
		if err != nil {
			return ok, fmt.Errorf("consumer: publish to %s: %w", o.queue, err)
		}
	}
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			return ok, fmt.Errorf("consumer: confirm from %s: %w", out[i].queue, err)
		}
		ok[i] = acked
	}
	// The broker sends basic.return before the ack of the same message, and
	// the client hands the return to our buffered channel before it resolves
	// the confirm, so every return for this round is already queued here.
	for {
		select {
		case r := <-p.returns:
			id, _ := r.Headers[publishIDHeader].(string)
			if i, found := ids[id]; found {
				ok[i] = false
			}
		default:
			return ok, nil
		}
	}
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

// Headers the runtime sets on the messages it republishes.
const (
	headerAttempt          = "x-idem-attempt"
	headerReason           = "x-idem-reason"
	headerError            = "x-idem-error"
	headerConsumer         = "x-idem-consumer"
	headerOriginalExchange = "x-idem-original-exchange"
	headerOriginalKey      = "x-idem-original-routing-key"
	headerAttempts         = "x-idem-attempts"
	headerPayloadHash      = "x-idem-payload-hash"
	headerStoredHash       = "x-idem-stored-hash"
)

// Declare connects once and sets up the topology as Config.Topology says,
// so that publishers can start before the first worker does.
func (c *Consumer) Declare(ctx context.Context) error {
	if c.cfg.AMQPURL == "" || c.cfg.Queue == "" {
		return configError("Declare needs AMQPURL and Queue")
	}
	s, err := c.connect(0)
	if err != nil {
		return err
	}
	s.close()
	return ctx.Err()
}
