// Package amqpconn bounds the waits that the AMQP client leaves open: the
// dial and handshake (DialWithin, for every AMQP connection idem dials), each
// synchronous call (Bound), each write (WriteDeadline), and, for the
// short-lived connections of idem's operator tools, all of them at once
// (Dial and Conn). DialAny dials a cluster: the first node of a shuffled
// list that answers, the nodes that failed lately last (Suspect); its
// DialTimeout, Heartbeat and AnswerTimeout make a node that stops
// answering cost seconds.
//
// amqp091 clears the dial deadline once the handshake is done, so a write to
// a broker that stopped reading (RabbitMQ blocks publishing connections on a
// memory or disk alarm) blocks for good. A synchronous method (queue.declare,
// basic.get, connection.close) waits for its answer with neither a timer nor
// a context, and the heartbeats a blocked broker keeps sending keep the read
// deadline from ever firing. A Conn gives every write a deadline, bounds
// every Call and its Close by a timeout, and closes its socket when its
// context ends: whatever was pending then returns amqp.ErrClosed.
//
// Gate and Gated bound in bytes what a consume connection holds in memory:
// the socket is not read while the deliveries taken and not yet settled
// fill the budget.
//
// Screen and Screened keep a message the client cannot decode from closing
// the consume connection, which would have the broker deliver it again to
// the next one, without end. amqp091-go refuses a content header whose
// properties it cannot read (a header table nested deeper than 32 levels or
// holding more than 8,192 entries, a field type it does not know) by
// closing the connection, and RabbitMQ relays such headers. The screen
// reads the frames the broker sends as the client will read them, checks
// each content header's property list by the client's own rules
// (properties.go follows amqp091-go's read.go step by step; a fuzz target
// holds the two together), and hands the client a header it can decode —
// without the properties it could not — while it notes the delivery, out of
// band, by its consumer tag and delivery tag. The consumer dead-letters a
// noted delivery with reason undecodable instead of running its handler.
// Over amqps, DialWithin makes the TLS connection itself, under the screen
// and the gate, so that they read frames, not ciphertext.
package amqpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Conn is an AMQP connection whose waits are bounded. Use its methods Call
// and Close in place of waiting on the client directly.
type Conn struct {
	*amqp.Connection
	ctx     context.Context
	sock    net.Conn
	timeout time.Duration
	stop    func() bool
}

// Dial opens a connection named name to one of the nodes of urls (see
// DialAny). The TCP connect and the handshake, each write, each Call and
// Close are bounded by timeout; when ctx ends, the socket is closed, which
// ends any call pending on it. Close the Conn when done, even after ctx
// ended. Errors quote no password.
func Dial(ctx context.Context, urls []string, name string, timeout time.Duration) (*Conn, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, sock, _, err := DialAny(ctx, urls, amqp.Config{Properties: props}, timeout,
		func(c net.Conn) net.Conn { return WriteDeadline(c, timeout) })
	if err != nil {
		return nil, err
	}
	c := &Conn{Connection: conn, ctx: ctx, sock: sock, timeout: timeout}
	c.stop = context.AfterFunc(ctx, func() { _ = sock.Close() })
	return c, nil
}

// DialWithin opens a connection to rawURL with cfg (its Dial is replaced).
// The TCP connect and the handshake are bounded by timeout, and end early
// when ctx does: the socket is closed, and the error wraps ctx's cause.
// Once DialWithin returns, ctx no longer concerns the connection. wrap, when
// set, wraps the socket the client is given; that socket is returned too,
// for closing it is how a caller ends a call that hangs (see Bound). For an
// amqps URL, DialWithin makes the TLS connection itself (with
// cfg.TLSClientConfig, else the configuration the URL's query describes;
// the handshake bounded as the rest) and wrap wraps that: it reads and
// writes AMQP frames whatever the scheme.
func DialWithin(ctx context.Context, rawURL string, cfg amqp.Config, timeout time.Duration, wrap func(net.Conn) net.Conn) (*amqp.Connection, net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, context.Cause(ctx)
	}
	target, tlsCfg, err := overTLS(rawURL, cfg.TLSClientConfig)
	if err != nil {
		return nil, nil, err
	}
	var sock net.Conn
	stop := func() bool { return true }
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// The handshakes' deadline: the client clears it once open.
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			_ = c.Close()
			return nil, err
		}
		if tlsCfg != nil {
			if c, err = handshake(ctx, c, tlsCfg); err != nil {
				return nil, err
			}
		}
		if wrap != nil {
			c = wrap(c)
		}
		sock, stop = c, context.AfterFunc(ctx, func() { _ = c.Close() })
		return c, nil
	}
	conn, err := amqp.DialConfig(target, cfg)
	if !stop() && err == nil { // ctx ended as the handshake finished
		_ = conn.CloseDeadline(time.Now())
		err = context.Cause(ctx)
	}
	if err == nil && conn.Config.Heartbeat > 0 {
		// The client clears the socket's deadlines once open, and arms the
		// read deadline again only when the next frame comes: a node that
		// goes silent right after open-ok would hold the connection for
		// good. Arm it as the client would (1.5 heartbeats); the client
		// moves it on with every frame.
		_ = sock.SetReadDeadline(time.Now().Add(3 * conn.Config.Heartbeat / 2))
	}
	if err != nil {
		if sock != nil {
			_ = sock.Close()
		}
		if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
		}
		return nil, nil, err
	}
	return conn, sock, nil
}

// Call runs call, a synchronous method on a channel of c (it waits for the
// broker's answer). If call has not returned within the timeout, or when
// the context ends, the socket is closed and call returns amqp.ErrClosed:
// the connection is unusable after that.
func (c *Conn) Call(call func() error) error {
	return Bound(c.ctx, c.sock, c.timeout, call)
}

// Bound runs call, which waits for the broker's answer to a synchronous
// method on the connection whose socket is sock. The client waits for such
// an answer with neither a timer nor a context, so a broker that stops
// answering, or a half-open socket, would hold the caller for good. Bound
// closes sock when timeout passes or ctx ends first: the connection dies,
// call returns amqp.ErrClosed, and the connection is unusable after that.
func Bound(ctx context.Context, sock net.Conn, timeout time.Duration, call func() error) error {
	timer := time.AfterFunc(timeout, func() { _ = sock.Close() })
	stop := context.AfterFunc(ctx, func() { _ = sock.Close() })
	err := call()
	// ctx may have ended without stop's hook closing sock: another hook on
	// ctx (Dial's) closed it first, and call returned before stop ran.
	timedOut, cancelled := !timer.Stop(), !stop() || ctx.Err() != nil
	if (timedOut || cancelled) && err == nil {
		err = amqp.ErrClosed // it answered as the socket closed
	}
	switch {
	case cancelled:
		return fmt.Errorf("%w (connection closed): %w", context.Cause(ctx), err)
	case timedOut:
		return fmt.Errorf("no answer from the broker within %s (connection closed): %w", timeout, err)
	}
	return err
}

// Err says why c can no longer be used: the context's cause when it ended,
// else amqp.ErrClosed when the connection closed, else nil.
func (c *Conn) Err() error {
	switch {
	case c.ctx.Err() != nil:
		return fmt.Errorf("%w (connection closed): %w", context.Cause(c.ctx), amqp.ErrClosed)
	case c.IsClosed():
		return amqp.ErrClosed
	}
	return nil
}

// Close closes the connection, waiting at most the timeout for the
// broker's close-ok, then its socket, and stops watching the context. The
// close deadline alone is not enough: the client extends the read deadline
// on every frame, and a blocked broker still sends heartbeats.
func (c *Conn) Close() error {
	defer c.stop()
	timer := time.AfterFunc(c.timeout, func() { _ = c.sock.Close() })
	defer timer.Stop()
	err := c.CloseDeadline(time.Now().Add(c.timeout))
	_ = c.sock.Close()
	return err
}

// WriteDeadline wraps c so that each write must end within timeout of its
// start, or fail (and with it the AMQP connection).
func WriteDeadline(c net.Conn, timeout time.Duration) net.Conn {
	return &writeDeadlineConn{Conn: c, timeout: timeout}
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
