package queuesource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one broker session: a consume connection (behind the gate)
// with its channel, and a publish connection with a confirm-mode channel.
// Deliveries remember their session: an ack is sent only on the channel that
// delivered the message, and only while that session is alive; after a
// reconnect, delivery tags restart at 1 on the new channel, so an old tag
// must never be acked there (invariant 7). When the session dies, its
// context is cancelled, and with it the handlers of its deliveries.
type session struct {
	gen     uint64
	conn    *amqp.Connection // consume
	ch      *amqp.Channel
	pubConn *amqp.Connection
	pub     *publisher
	acks    *acker // settles ch's deliveries
	gate    *gate
	dead    chan struct{}
	once    sync.Once
	ctx     context.Context // the batches' context: ends when the session dies
	cancel  context.CancelCauseFunc
}

// errSessionDied is the cause of a dead session's context.
var errSessionDied = errors.New("queuesource: broker session died")

func (s *session) kill() {
	s.once.Do(func() {
		close(s.dead)
		s.cancel(errSessionDied)
	})
}

func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}

// close ends the session: the gate opens (closing needs the broker's
// answer on the consume connection) and both connections close.
func (s *session) close() {
	s.kill()
	s.gate.release()
	deadline := time.Now().Add(closeTimeout)
	_ = s.conn.CloseDeadline(deadline)
	_ = s.pubConn.CloseDeadline(deadline)
}

// closeTimeout bounds waiting for the broker's answer to a connection close.
const closeTimeout = 5 * time.Second

// ErrFatal marks broker errors that reconnecting cannot fix (wrong
// credentials, no access to the vhost or queue, wrong queue arguments):
// Run returns them.
var ErrFatal = errors.New("fatal broker error")

// RedactURL hides the password of an AMQP URL for logs and errors.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	return u.Redacted()
}

// dial opens a connection; g, when set, gates its socket.
func (src *Source) dial(name string, g *gate) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	plain := amqp.DefaultDial(10 * time.Second)
	dial := func(network, addr string) (net.Conn, error) {
		c, err := plain(network, addr)
		if err != nil {
			return nil, err
		}
		// A write that cannot go out within CommitTimeout (the broker
		// blocks publishers on a memory or disk alarm, a half-open socket)
		// fails the connection, and with it the session, instead of
		// blocking a worker for good.
		c = &writeDeadlineConn{Conn: c, timeout: src.cfg.CommitTimeout}
		if g != nil {
			return gated(c, g), nil
		}
		return c, nil
	}
	conn, err := amqp.DialConfig(src.cfg.AMQPURL, amqp.Config{Properties: props, Heartbeat: 10 * time.Second, Dial: dial})
	if err != nil {
		err = fmt.Errorf("dial %s: %w", RedactURL(src.cfg.AMQPURL), err)
		if isAccessRefused(err) { // credentials, vhost access, SASL: all access-refused
			return nil, fmt.Errorf("%w: %w", ErrFatal, err)
		}
		return nil, err
	}
	return conn, nil
}

func isAccessRefused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// connect opens a session and sets up its channels and the topology.
func (src *Source) connect(parent context.Context, gen uint64) (_ *session, err error) {
	g := newGate(src.cfg.MaxBufferedBytes)
	conn, err := src.dial(src.cfg.ConnectionName, g)
	if err != nil {
		return nil, err
	}
	s := &session{gen: gen, conn: conn, gate: g, dead: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancelCause(parent)
	defer func() {
		if err != nil {
			s.cancel(err)
			g.release()
			_ = conn.Close()
			if s.pubConn != nil {
				_ = s.pubConn.Close()
			}
		}
	}()
	fail := func(what string, err error) error {
		var ae *amqp.Error
		if errors.As(err, &ae) && (ae.Code == amqp.PreconditionFailed || ae.Code == amqp.AccessRefused || ae.Code == amqp.NotFound) {
			return fmt.Errorf("%w: %s: %v", ErrFatal, what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if s.ch, err = conn.Channel(); err != nil {
		return nil, fail("open channel", err)
	}
	if err := src.declare(s.ch); err != nil {
		return nil, fail("topology", err)
	}
	if err := s.ch.Qos(src.cfg.Prefetch, 0, false); err != nil {
		return nil, fail("qos", err)
	}
	s.acks = newAcker(s.ch, src.cfg.Prefetch)
	if s.pubConn, err = src.dial(src.cfg.ConnectionName+" (publish)", nil); err != nil {
		return nil, err
	}
	pch, err := s.pubConn.Channel()
	if err != nil {
		return nil, fail("open publish channel", err)
	}
	if err := pch.Confirm(false); err != nil {
		return nil, fail("confirm mode", err)
	}
	s.pub = &publisher{ch: pch, returns: pch.NotifyReturn(make(chan amqp.Return, 2*publishChunk))}
	return s, nil
}

// declare sets up the queue, the retry queue (whose expired messages flow
// back to the queue) and the dead-letter queue, as Config.Topology says.
func (src *Source) declare(ch *amqp.Channel) error {
	cfg := &src.cfg
	mainArgs := amqp.Table{
		"x-queue-type":              cfg.QueueType,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": cfg.DeadLetterQueue,
	}
	if cfg.QueueType == "quorum" {
		// Backstop for poison messages that crash the worker before it can
		// decide: the broker dead-letters them (x-death reason delivery_limit).
		mainArgs["x-delivery-limit"] = int64(cfg.DeliveryLimit)
	}
	queues := []struct {
		name string
		args amqp.Table
	}{
		{cfg.Queue, mainArgs},
		{cfg.RetryQueue, amqp.Table{
			"x-queue-type":              "classic",
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": cfg.Queue,
		}},
		{cfg.DeadLetterQueue, amqp.Table{"x-queue-type": cfg.QueueType}},
	}
	for _, q := range queues {
		var err error
		switch cfg.Topology {
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
	p.dropStaleReturns()
	ok = make([]bool, len(out))
	confirms := make([]*amqp.DeferredConfirmation, len(out))
	ids := make(map[string]int, len(out))
	for i, o := range out {
		id := strconv.FormatUint(p.seq.Add(1), 10)
		o.msg.Headers[publishIDHeader] = id
		ids[id] = i
		confirms[i], err = p.ch.PublishWithDeferredConfirmWithContext(ctx, "", o.queue, true, false, o.msg)
		if err != nil {
			return ok, fmt.Errorf("publish to %s: %w", o.queue, err)
		}
	}
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			return ok, fmt.Errorf("confirm from %s: %w", out[i].queue, err)
		}
		ok[i] = acked
	}
	// The broker sends basic.return before the ack of the same message, and
	// the client hands the return to our buffered channel before it resolves
	// the confirm, so every return for this round is already queued here.
	for {
		select {
		case r, open := <-p.returns:
			if !open { // the channel closed: its returns were all queued before
				return ok, nil
			}
			id, _ := r.Headers[publishIDHeader].(string)
			if i, found := ids[id]; found {
				ok[i] = false
			}
		default:
			return ok, nil
		}
	}
}

// dropStaleReturns empties the returns channel of what earlier rounds that
// failed before reading it left there: it must hold room for this round's.
// The client closes the channel with the AMQP channel, and a closed channel
// never blocks: that ends the loop too.
func (p *publisher) dropStaleReturns() {
	for {
		select {
		case _, open := <-p.returns:
			if !open {
				return
			}
		default:
			return
		}
	}
}

// writeDeadlineConn gives every write a deadline.
type writeDeadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *writeDeadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
