package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/internal/amqpconn"
	"github.com/idemkit/idem/internal/amqpurl"
	"github.com/idemkit/idem/internal/tracing"
)

const (
	// amqpDialTimeout bounds the TCP connect and the AMQP handshake of a
	// dial by idem, when the call's deadline does not end sooner.
	amqpDialTimeout = 10 * time.Second
	// amqpCloseTimeout bounds the close handshake of a connection.
	amqpCloseTimeout = 5 * time.Second
)

// errExecutorClosed is returned by calls after Close.
var errExecutorClosed = errors.New("executor is closed")

// errBlocked is returned, retryable, by a publish while the broker blocks
// the connection (connection.blocked: a memory or disk alarm).
type errBlocked struct{ reason string }

func (e errBlocked) Error() string {
	return "connection blocked by the broker (" + e.reason + "); nothing sent"
}

// session returns the open session, dialling a new one if there is none.
// One call dials at a time, bounded by its own ctx; the others wait for it
// at most until their ctx ends. No lock is held across a call into the
// client.
func (e *AMQPExecutor) session(ctx context.Context) (*amqpSession, error) {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, errExecutorClosed
		}
		if s := e.sess; s != nil && !s.dead() {
			e.mu.Unlock()
			return s, nil
		}
		if old := e.sess; old != nil {
			e.sess = nil
			go old.close() // bounded; nobody waits for it
			e.log.Info("ledger: amqp connection lost, reconnecting")
		}
		if wait := e.dialing; wait != nil {
			e.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("wait for the connection being dialled: %w", ctx.Err())
			}
		}
		done := make(chan struct{})
		e.dialing = done
		e.mu.Unlock()

		s, err := dialSession(ctx, e.cfg, e.nodes)

		e.mu.Lock()
		e.dialing = nil
		close(done)
		if err == nil && e.closed {
			e.mu.Unlock()
			go s.close()
			return nil, errExecutorClosed
		}
		e.sess = s
		e.mu.Unlock()
		return s, err
	}
}

// amqpSession is a connection with one confirm-mode channel. Confirms are
// deferred confirmations (no listener goroutine the client could block on);
// returns land in a buffered channel that publishers drain after their
// confirm, under a lock that is never held across a call into the client.
type amqpSession struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	blocked atomic.Pointer[string] // the broker's reason while it blocks the connection
	broken  atomic.Bool            // a publish failed in the client: the connection is being torn down
	nacked  atomic.Bool            // the broker nacked a publish: the next call dials afresh

	mu       sync.Mutex           // guards returned
	returned map[string]string    // message id → reply text of a return not yet claimed
	server   []attribute.KeyValue // server.address and server.port of the node, for spans
}

// returnsBuffer bounds the returns waiting to be drained. The client drops a
// return it cannot deliver within 5 s (which would pass for a stored
// message), so it must exceed the publishes in flight at once.
const returnsBuffer = 4096

// dialSession dials and sets up a session within ctx: when ctx ends first,
// the connection is closed, which ends the handshake or the set-up waiting
// for the broker, and dialSession returns.
func dialSession(ctx context.Context, cfg AMQPConfig, nodes []string) (*amqpSession, error) {
	conn, node, err := dial(ctx, cfg, nodes)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	s, err := setUp(conn)
	if err == nil {
		s.server = serverAttrs(node)
	}
	if !stop() {
		return nil, fmt.Errorf("set up the channel: %w", context.Cause(ctx))
	}
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(amqpCloseTimeout))
		return nil, err
	}
	return s, nil
}

// setUp opens the confirm-mode channel of conn and its listeners.
func setUp(conn *amqp.Connection) (*amqpSession, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("put the channel in confirm mode: %w", err)
	}
	s := &amqpSession{conn: conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, returnsBuffer)),
		returned: map[string]string{}}
	// The client sends to this channel from its reader and waits: drain it
	// until the connection closes it.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	go func() {
		for b := range blocks {
			if b.Active {
				reason := b.Reason
				s.blocked.Store(&reason)
			} else {
				s.blocked.Store(nil)
			}
		}
	}()
	return s, nil
}

// dial opens a connection within ctx to the first node that answers, in a
// shuffled order, and returns the URL it reached. idem's own dial closes
// its socket when ctx ends; a custom Dial cannot be interrupted, so dial
// stops waiting for it and closes what it returns too late.
func dial(ctx context.Context, cfg AMQPConfig, nodes []string) (*amqp.Connection, string, error) {
	if cfg.Dial == nil {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(cmp.Or(cfg.ConnectionName, "idem:ledger"))
		conn, _, node, err := amqpconn.DialAny(ctx, nodes, amqp.Config{Properties: props}, amqpDialTimeout, nil)
		if err != nil {
			return nil, "", fmt.Errorf("dial: %w", err)
		}
		return conn, node, nil
	}
	var fails []error
	for _, node := range amqpurl.Shuffled(nodes) {
		conn, err := dialWith(ctx, cfg.Dial, node)
		if err == nil {
			return conn, node, nil
		}
		if ctx.Err() != nil {
			return nil, "", err
		}
		fails = append(fails, fmt.Errorf("%s: %w", amqpurl.Redact(node), err))
	}
	return nil, "", fmt.Errorf("dial: %w", errors.Join(fails...))
}

// dialWith runs a custom Dial of node, waiting for it until ctx ends.
func dialWith(ctx context.Context, dialNode func(string) (*amqp.Connection, error), node string) (*amqp.Connection, error) {
	type dialed struct {
		conn *amqp.Connection
		err  error
	}
	out := make(chan dialed, 1)
	go func() {
		conn, err := dialNode(node)
		out <- dialed{conn, err}
	}()
	select {
	case d := <-out:
		return d.conn, d.err
	case <-ctx.Done():
		go func() {
			if d := <-out; d.err == nil {
				_ = d.conn.CloseDeadline(time.Now().Add(amqpCloseTimeout))
			}
		}()
		return nil, fmt.Errorf("dial: %w", context.Cause(ctx))
	}
}

// serverAttrs are the span attributes server.address and server.port of
// the node at rawURL.
func serverAttrs(rawURL string) []attribute.KeyValue {
	u, err := amqp.ParseURI(rawURL)
	if err != nil {
		return nil
	}
	return tracing.ServerAddress(net.JoinHostPort(u.Host, strconv.Itoa(u.Port)), 0)
}

// dead reports whether the session can no longer publish: its channel
// closed, or a publish failed in the client (the client tears the connection
// down in the background, and the next call must not find it half closed),
// or the broker nacked a publish. A connection that had a publish to a
// quorum queue nacked while the queue elected a new leader may go on having
// every publish to it nacked, long after the election (RabbitMQ 3.10), where
// a new connection publishes at once; so after a nack, the next call dials
// afresh.
func (s *amqpSession) dead() bool { return s.broken.Load() || s.nacked.Load() || s.ch.IsClosed() }

// close closes the connection, waiting at most amqpCloseTimeout for the
// broker's close-ok.
func (s *amqpSession) close() error {
	err := s.conn.CloseDeadline(time.Now().Add(amqpCloseTimeout))
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// errInterrupted reports a publish whose write was still blocked when its
// ctx ended: the connection was closed under it, and part of the message
// may have left.
var errInterrupted = errors.New("publish still writing when its deadline came; connection closed")

// publish sends msg and returns its deferred confirmation. While the broker
// blocks the connection it fails at once (errBlocked), sending nothing. The
// client checks ctx only on entry, and its write blocks while the socket
// does (a broker that stopped reading, a stalled network): a write still
// blocked when ctx ends closes the connection, which ends it
// (errInterrupted).
func (s *amqpSession) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	if reason := s.blocked.Load(); reason != nil {
		return nil, errBlocked{reason: *reason}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.returned, msg.MessageId) // a stale return of an earlier attempt
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = s.conn.CloseDeadline(time.Now()) })
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	interrupted := !stop()
	if err != nil {
		s.broken.Store(true)
		if interrupted {
			return nil, fmt.Errorf("%w: %w", errInterrupted, err)
		}
	}
	return dc, err
}

// returnOf reports whether the broker returned the message with id as
// unroutable. Call it after the message's confirm: the broker sends
// basic.return before the ack, and the client queues the return before it
// resolves the confirm.
func (s *amqpSession) returnOf(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		select {
		case r, ok := <-s.returns:
			if ok {
				s.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
				continue
			}
		default:
		}
		break
	}
	text, found := s.returned[id]
	delete(s.returned, id)
	return text, found
}
