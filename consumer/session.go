package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/retry"
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
	node    string           // the URL both connections reached
	conn    *amqp.Connection // consume
	sock    net.Conn         // conn's socket, closed to end a call that hangs
	ch      *amqp.Channel
	pubConn *amqp.Connection
	pubSock net.Conn // pubConn's socket
	pub     *publisher
	acks    *acker // settles ch's deliveries
	gate    *amqpconn.Gate
	screen  *amqpconn.Screen // notes the deliveries the client could not decode
	dead    chan struct{}
	once    sync.Once
	why     error           // why the session was killed; set before dead closes
	ctx     context.Context // the batches' context: ends when the session dies
	cancel  context.CancelCauseFunc
}

// errSessionDied is the cause of a dead session's context.
var errSessionDied = errors.New("consumer: broker session died")

// errNotStored ends a session whose retry or dead-letter copies the broker
// did not store (returned as unroutable, or refused with a nack): such a
// session counts as one that worked only if it lasted retry.Steady,
// whatever it acked, so that reconnecting into the same refusal backs off.
var errNotStored = errors.New("broker did not store retries or dead letters")

// worked reports whether the session, which lasted lived, did some good:
// it lasted retry.Steady, or the broker took acks from it and it did not
// end because the broker would not store its retries or dead letters. A
// session that did not work makes Run back off further before it
// reconnects. Call it once the session is closed.
func (s *session) worked(lived time.Duration) bool {
	if lived >= retry.Steady {
		return true
	}
	return s.acks != nil && s.acks.sent.Load() && !errors.Is(s.why, errNotStored)
}

// kill ends the session for the reason why (the first reason wins): its
// batches' context is cancelled, and serve returns why.
func (s *session) kill(why error) {
	s.once.Do(func() {
		s.why = why
		close(s.dead)
		s.cancel(fmt.Errorf("%w: %w", errSessionDied, why))
	})
}

// close ends the session: the gate opens (closing needs the broker's
// answer on the consume connection) and both connections close.
func (s *session) close() {
	s.kill(errors.New("session closed"))
	s.gate.Release()
	deadline := time.Now().Add(closeTimeout)
	_ = s.conn.CloseDeadline(deadline)
	_ = s.pubConn.CloseDeadline(deadline)
}

// abandon closes the session's sockets without the AMQP close handshake,
// for a session that died: its node may not answer a close (a frozen node
// would hold each connection's close for closeTimeout), and the broker
// requeues what was not acked either way.
func (s *session) abandon() {
	_ = s.sock.Close()
	if s.pubSock != nil {
		_ = s.pubSock.Close()
	}
}

// closeTimeout bounds waiting for the broker's answer to a connection close.
const closeTimeout = 5 * time.Second

// screened dead-letters it, the item of delivery d, as undecodable when
// the screen rewrote d's properties because the client could not decode
// them (invariant 22): its handler never runs, its row is found by the
// message id when the client could read it, else by "sha256:" and its
// payload hash, and its dead-letter copy keeps its body.
func (s *session) screened(it *engine.Item, d *amqp.Delivery) {
	if why, ok := s.screen.Undecodable(d.ConsumerTag, d.DeliveryTag); ok {
		it.Reject = &engine.Reject{Reason: deadletters.ReasonUndecodable, Err: why}
	}
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

// errFatal marks broker errors that reconnecting cannot fix (wrong
// credentials, no access to the vhost or queue, wrong queue arguments):
// Run returns them.
var errFatal = errors.New("fatal broker error")

// guards stand between a consume connection's socket and the client: the
// gate bounds in bytes what it reads ahead, the screen keeps a message the
// client cannot decode from closing the connection.
type guards struct {
	gate   *amqpconn.Gate
	screen *amqpconn.Screen
}

// dial opens a connection to the first node of urls that answers, in a
// shuffled order (amqpconn.DialAny); g, when set, guards its socket. It
// returns the socket too, as the client uses it (writes with a deadline,
// reads behind the guards): closing it is how brokerCall ends a call that
// hangs. Each node's TCP connect and AMQP handshake are bounded by
// dialTimeout, and end early when ctx does. A refusal that dialling again
// cannot change (credentials, a vhost that does not exist) is errFatal.
func (src *queueSource) dial(ctx context.Context, name string, g *guards, urls []string) (*amqp.Connection, net.Conn, string, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	cfg := amqp.Config{Properties: props, Heartbeat: amqpconn.Heartbeat, FrameSize: amqpconn.FrameMax,
		TLSClientConfig: src.cfg.TLSConfig}
	conn, sock, node, err := amqpconn.DialAny(ctx, urls, cfg, dialTimeout,
		func(c net.Conn) net.Conn {
			// A write that cannot go out within CommitTimeout (the broker
			// blocks publishers on a memory or disk alarm, a half-open
			// socket) fails the connection, and with it the session,
			// instead of blocking a worker for good.
			c = amqpconn.WriteDeadline(c, src.cfg.CommitTimeout)
			if g != nil {
				c = amqpconn.Screened(amqpconn.Gated(c, g.gate), g.screen)
			}
			return c
		})
	if err != nil {
		if errors.Is(err, amqpconn.ErrRefused) {
			return nil, nil, "", fmt.Errorf("%w: %w", errFatal, err)
		}
		return nil, nil, "", err
	}
	return conn, sock, node, nil
}

// dialTimeout bounds the TCP connect and the AMQP handshake.
const dialTimeout = amqpconn.DialTimeout

// brokerCall runs call, a synchronous method on the connection whose socket
// is sock (channel.open, queue.declare, basic.qos, confirm.select,
// basic.consume, basic.cancel), bounded by CommitTimeout, at most
// amqpconn.AnswerTimeout, and ctx (see amqpconn.Bound). The connection is
// unusable after a call cut short; every caller then ends its session, and
// the next dials another node first (a node whose queue leader is frozen
// never answers basic.consume).
func (src *queueSource) brokerCall(ctx context.Context, sock net.Conn, call func() error) error {
	return amqpconn.Bound(ctx, sock, min(src.cfg.CommitTimeout, amqpconn.AnswerTimeout), call)
}

// fatal reports whether a broker's answer to a topology or consume call is
// one that reconnecting cannot fix: access refused, a queue that exists
// with other arguments, a queue that does not exist. A queue whose node is
// down (a classic queue's home node, a quorum queue without a leader yet)
// is not fatal: it comes back with its node, or with an election.
func fatal(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.PreconditionFailed:
		return true
	case amqp.NotFound:
		return !strings.Contains(ae.Reason, "down") && !strings.Contains(ae.Reason, "not available") &&
			!strings.Contains(ae.Reason, "inaccessible")
	}
	return false
}

// connect opens a session and sets up its channels and the topology. Each
// broker call is bounded by CommitTimeout and ends with ctx (brokerCall);
// the session's batches run on a context derived from work.
func (src *queueSource) connect(ctx, work context.Context, gen uint64) (_ *session, err error) {
	g := amqpconn.NewGate(src.cfg.MaxBufferedBytes)
	screen := amqpconn.NewScreen()
	conn, sock, node, err := src.dial(ctx, src.cfg.ConnectionName, &guards{gate: g, screen: screen}, src.nodes)
	if err != nil {
		return nil, err
	}
	s := &session{gen: gen, node: node, conn: conn, sock: sock, gate: g, screen: screen, dead: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancelCause(work)
	defer func() {
		if err != nil {
			if ctx.Err() == nil {
				amqpconn.Suspect(node)
			}
			s.cancel(err)
			g.Release()
			_ = conn.Close()
			if s.pubConn != nil {
				_ = s.pubConn.Close()
			}
		}
	}()
	fail := func(what string, err error) error {
		if fatal(err) {
			return fmt.Errorf("%w: %s: %v", errFatal, what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := src.brokerCall(ctx, sock, func() (err error) { s.ch, err = conn.Channel(); return err }); err != nil {
		return nil, fail("open channel", err)
	}
	if err := src.brokerCall(ctx, sock, func() (err error) { s.ch, err = src.declare(conn, s.ch); return err }); err != nil {
		return nil, fail("topology", err)
	}
	if err := src.brokerCall(ctx, sock, func() error { return s.ch.Qos(src.cfg.Prefetch, 0, false) }); err != nil {
		return nil, fail("qos", err)
	}
	s.acks = newAcker(s.ch, src.cfg.Prefetch)
	// The publish connection goes to the node the consume connection
	// reached: a session depends on one node, not two.
	if s.pubConn, s.pubSock, _, err = src.dial(ctx, src.cfg.ConnectionName+" (publish)", nil, []string{node}); err != nil {
		return nil, err
	}
	var pch *amqp.Channel
	if err := src.brokerCall(ctx, s.pubSock, func() (err error) { pch, err = s.pubConn.Channel(); return err }); err != nil {
		return nil, fail("open publish channel", err)
	}
	if err := src.brokerCall(ctx, s.pubSock, func() error { return pch.Confirm(false) }); err != nil {
		return nil, fail("confirm mode", err)
	}
	s.pub = &publisher{ch: pch, returns: pch.NotifyReturn(make(chan amqp.Return, 2*publishChunk))}
	return s, nil
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

// outgoing is one message to publish to a queue through the default exchange.
type outgoing struct {
	queue string
	msg   amqp.Publishing
}

// fate is what the broker did with one published message.
type fate uint8

const (
	// unconfirmed: not published, or no confirm came (the publish failed,
	// the channel closed, the context ended).
	unconfirmed fate = iota
	// inQueue: acked and not returned; the queue holds it.
	inQueue
	// returned: the broker returned it (basic.return): no queue to route
	// it to, such as a deleted retry or dead-letter queue.
	returned
	// refused: the broker nacked it (basic.nack): the queue would not take
	// it, such as a full queue with x-overflow reject-publish.
	refused
)

// publishChunk bounds the publishes awaiting confirms at once, so that the
// returns of a chunk always fit the returns channel (the client drops a
// return it cannot deliver within 5 s, which would pass for stored).
const publishChunk = 512

// publishAll publishes every message and waits for the confirms; fates[i]
// says whether message i is stored in its queue, and if not, why.
func (p *publisher) publishAll(ctx context.Context, out []outgoing) (fates []fate, err error) {
	fates = make([]fate, 0, len(out))
	for len(out) > 0 {
		n := min(len(out), publishChunk)
		part, err := p.publishChunk(ctx, out[:n])
		fates = append(fates, part...)
		if err != nil {
			return append(fates, make([]fate, len(out)-n)...), err
		}
		out = out[n:]
	}
	return fates, nil
}

// publishChunk publishes at most publishChunk messages; see publishAll.
func (p *publisher) publishChunk(ctx context.Context, out []outgoing) (fates []fate, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropStaleReturns()
	fates = make([]fate, len(out))
	confirms := make([]*amqp.DeferredConfirmation, len(out))
	ids := make(map[string]int, len(out))
	for i, o := range out {
		id := strconv.FormatUint(p.seq.Add(1), 10)
		o.msg.Headers[amqpnames.HeaderPublishID] = id
		ids[id] = i
		confirms[i], err = p.ch.PublishWithDeferredConfirmWithContext(ctx, "", o.queue, true, false, o.msg)
		if err != nil {
			return fates, fmt.Errorf("publish to %s: %w", o.queue, err)
		}
	}
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			return fates, fmt.Errorf("confirm from %s: %w", out[i].queue, err)
		}
		fates[i] = refused
		if acked {
			fates[i] = inQueue
		}
	}
	// The broker sends basic.return before the ack of the same message, and
	// the client hands the return to our buffered channel before it resolves
	// the confirm, so every return for this round is already queued here.
	for {
		select {
		case r, open := <-p.returns:
			if !open { // the channel closed: its returns were all queued before
				return fates, nil
			}
			id, _ := r.Headers[amqpnames.HeaderPublishID].(string)
			if i, found := ids[id]; found {
				fates[i] = returned
			}
		default:
			return fates, nil
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
