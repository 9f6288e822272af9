// Package faultproxy gives idem's own tests a TCP proxy in front of a real
// server (RabbitMQ, PostgreSQL) that can fail the way networks and servers
// fail, for one test only: cut every connection (Sever), stop passing bytes
// while every socket stays open (Stall, StallOpen, Resume), or let a server
// go deaf to its client from a point in the conversation (Deafen).
//
// It knows nothing of the protocols it carries; testbroker adds AMQP.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Side is one end of a proxied connection.
type Side int

const (
	// Client is the end that connected to the proxy.
	Client Side = iota + 1
	// Target is the server the proxy forwards to.
	Target
)

// Option configures a Proxy.
type Option func(*Proxy)

// Deafen makes every connection go deaf once it reaches a point that find
// looks for in the bytes that side sends: from there on the proxy reads what
// the client sends and drops it, while what the target sends still passes.
// To the client that is a server that stopped answering (a broker in a
// memory alarm, a hung backend) on a socket that stays up; the client's own
// close still reaches the target.
//
// newFind is called once per connection, so that find may keep state (a
// frame cut across reads). find is given each chunk side sends, in order,
// before it is forwarded, until it reports found; at is where in that chunk
// the point lies. When side is Client, the chunk's bytes from at on are
// dropped too; when it is Target, the whole chunk passes, and the deafness
// starts before the client can see it.
func Deafen(side Side, newFind func() func(chunk []byte) (at int, found bool)) Option {
	return func(p *Proxy) { p.deafSide, p.newFind = side, newFind }
}

// Proxy forwards TCP connections to a target, in both directions, until the
// test makes it fail. It stops when the test ends: the listener closes,
// every connection is cut and every goroutine it started returns.
type Proxy struct {
	ln       net.Listener
	target   string
	deafSide Side
	newFind  func() func([]byte) (int, bool)
	wg       sync.WaitGroup

	stallOnce sync.Once
	stalled   chan struct{} // closed at the first stall

	mu       sync.Mutex
	conns    map[*conn]struct{}
	accepted int
	holdNew  bool // connections accepted from now on start stalled
	refuse   bool // connections accepted from now on are closed at once
	closed   bool
}

// New starts a proxy in front of target (host:port) and returns it.
// Connect to Addr.
func New(tb testing.TB, target string, opts ...Option) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, stalled: make(chan struct{}), conns: map[*conn]struct{}{}}
	for _, o := range opts {
		o(p)
	}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.Sever()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many connections the proxy has forwarded so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Sever closes every connection open now, on both sides, the way a network
// failure or `rabbitmqctl close_all_connections` would. New connections are
// accepted again right away.
func (p *Proxy) Sever() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[*conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Stall stops passing bytes, both ways, on every connection: those open now
// and those accepted until Resume. Sockets stay open and the proxy reads
// little, so a client writing much soon blocks: a network that drops packets
// without resetting anything, or a dead peer behind a firewall.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.holdNew = true
	p.mu.Unlock()
	p.StallOpen()
}

// StallOpen stalls the connections open now, as Stall does; those accepted
// later pass, so a client that gives up on a stalled connection can open a
// working one.
func (p *Proxy) StallOpen() {
	p.mu.Lock()
	for c := range p.conns {
		c.hold()
	}
	p.mu.Unlock()
	p.noteStall()
}

// Refuse closes every connection open now and, until Resume, every new
// one as soon as it is accepted: a server that is down, or a firewall that
// rejects.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	p.Sever()
}

// Resume passes bytes again on every stalled connection, the held ones
// first, and lets new connections pass.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdNew, p.refuse = false, false
	for c := range p.conns {
		c.release()
	}
}

// Stalled is closed once the proxy first stopped forwarding: at the first
// Stall or StallOpen, or when a connection first went deaf (see Deafen).
func (p *Proxy) Stalled() <-chan struct{} { return p.stalled }

func (p *Proxy) noteStall() { p.stallOnce.Do(func() { close(p.stalled) }) }

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = client.Close()
			continue
		}
		target, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		// A small buffer: a stalled proxy takes few bytes off its client
		// before the client's writes block.
		_ = client.(*net.TCPConn).SetReadBuffer(64 << 10)
		c := &conn{client: client, target: target, gate: passing, done: make(chan struct{})}
		if p.newFind != nil {
			c.find = p.newFind()
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.accepted++
		p.conns[c] = struct{}{}
		if p.holdNew {
			c.hold()
		}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(c, Client) })
		p.wg.Go(func() { p.pipe(c, Target) })
	}
}

// pipe forwards what side from of c sends to the other side, until either
// socket fails or closes, or the proxy closes c.
func (p *Proxy) pipe(c *conn, from Side) {
	src, dst := c.client, c.target
	if from == Target {
		src, dst = c.target, c.client
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass(c) {
			return
		}
		chunk := p.listen(c, from, buf[:n])
		if len(chunk) > 0 {
			if _, werr := dst.Write(chunk); werr != nil {
				p.drop(c)
				return
			}
		}
		if errors.Is(err, io.EOF) {
			// Pass the half-close on, as a network would; the connection
			// ends when both sides have.
			_ = dst.(*net.TCPConn).CloseWrite()
			if c.ends.Add(1) == 2 {
				p.drop(c)
			}
			return
		}
		if err != nil {
			p.drop(c)
			return
		}
	}
}

// pass waits while c is stalled; it reports false once c is closed.
func (p *Proxy) pass(c *conn) bool {
	p.mu.Lock()
	gate := c.gate
	p.mu.Unlock()
	select {
	case <-gate:
		return true
	case <-c.done:
		return false
	}
}

// listen returns the part of chunk, sent by side from, that the other side
// gets: all of it, unless the target is deaf to the client.
func (p *Proxy) listen(c *conn, from Side, chunk []byte) []byte {
	if c.find != nil && !c.deaf.Load() && from == p.deafSide {
		if at, found := c.find(chunk); found {
			c.deaf.Store(true)
			p.noteStall()
			if from == Client {
				return chunk[:at]
			}
		}
	}
	if from == Client && c.deaf.Load() {
		return nil
	}
	return chunk
}

// drop closes c and forgets it.
func (p *Proxy) drop(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.close()
}

// passing is the gate of a connection that is not stalled.
var passing = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// conn is one proxied connection: the client's socket and the target's.
type conn struct {
	client, target net.Conn
	find           func([]byte) (int, bool) // nil without Deafen
	deaf           atomic.Bool              // the target no longer gets what the client sends
	ends           atomic.Int32             // sides that closed their half
	gate           chan struct{}            // closed while bytes pass; guarded by the proxy's mu
	done           chan struct{}            // closed with the sockets
	closeOnce      sync.Once
}

// hold stalls c; the caller holds the proxy's mu.
func (c *conn) hold() {
	if c.gate == passing {
		c.gate = make(chan struct{})
	}
}

// release resumes c; the caller holds the proxy's mu.
func (c *conn) release() {
	if c.gate != passing {
		close(c.gate)
		c.gate = passing
	}
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		_ = c.client.Close()
		_ = c.target.Close()
	})
}
