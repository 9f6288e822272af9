package amqpconn

import (
	"net"
	"sync"
	"time"
)

// Gate bounds in bytes what a consume connection holds in memory.
// RabbitMQ ignores basic.qos prefetch-size, and a consumer's prefetch count
// cannot change once it consumes, so the count alone would let a window of
// large messages (prefetch × 16 MiB) into memory. The gate sits under the
// AMQP client, on the connection's socket: once the bodies of the deliveries
// taken and not yet settled, plus what was read since the last one, reach
// the budget, it stops reading the socket until a settlement frees room.
// The broker then waits on TCP flow control; nothing is lost or reordered.
// The consumer accounts each delivery it takes (Take) and settles (Give).
// It always lets the next delivery in while nothing is held, so a single
// message larger than the budget still passes: memory stays below the
// budget plus one message.
//
// Publishing (dead letters, retries, their confirms) must run on a
// connection of its own, which the gate never blocks, so that settling never
// waits on the gate; and before an RPC that needs the broker's answer on the
// consume connection (cancel, close) the gate must be opened for good
// (Release).
type Gate struct {
	mu      sync.Mutex
	budget  int64
	held    int64 // bodies of deliveries taken and not yet settled
	partial int64 // bytes read from the socket since the last delivery was taken
	open    bool  // the session ends: never block again
	changed chan struct{}
}

// NewGate returns a gate with a budget of budget bytes.
func NewGate(budget int64) *Gate {
	return &Gate{budget: budget, changed: make(chan struct{})}
}

// Take accounts a delivery of n body bytes handed on.
func (g *Gate) Take(n int) {
	g.mu.Lock()
	g.held += int64(n)
	g.partial = 0 // what was read since the last delivery was this one
	g.mu.Unlock()
}

// Give frees the n body bytes of a settled delivery.
func (g *Gate) Give(n int) {
	g.mu.Lock()
	g.held -= int64(n)
	g.wake()
	g.mu.Unlock()
}

// Release opens the gate for good.
func (g *Gate) Release() {
	g.mu.Lock()
	g.open = true
	g.wake()
	g.mu.Unlock()
}

// Held is what the gate accounts for now.
func (g *Gate) Held() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held + g.partial
}

// wake tells the readers waiting at the gate that it changed.
func (g *Gate) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// read accounts n bytes read from the socket.
func (g *Gate) read(n int) {
	g.mu.Lock()
	g.partial += int64(n)
	g.mu.Unlock()
}

// wait blocks until the socket may be read (or closed is closed, ok false);
// waited reports whether it blocked at all.
func (g *Gate) wait(closed <-chan struct{}) (waited, ok bool) {
	g.mu.Lock()
	for !g.open && g.held > 0 && g.held+g.partial >= g.budget {
		ch := g.changed
		g.mu.Unlock()
		waited = true
		select {
		case <-ch:
		case <-closed:
			return true, false
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	return waited, true
}

// gatedConn is a consume connection's socket behind a gate.
type gatedConn struct {
	net.Conn
	gate   *Gate
	closed chan struct{}
	once   sync.Once

	mu sync.Mutex
	// readTimeout is the read deadline the AMQP client last set, as a
	// duration from when it set it: the client rearms it after every frame
	// (heartbeat timeout), and a wait at the gate must not count against it.
	readTimeout time.Duration
}

// Gated returns c behind g: a Read waits while g is full, and Close ends
// that wait.
func Gated(c net.Conn, g *Gate) net.Conn {
	return &gatedConn{Conn: c, gate: g, closed: make(chan struct{})}
}

func (c *gatedConn) Read(p []byte) (int, error) {
	waited, ok := c.gate.wait(c.closed)
	if !ok {
		return 0, net.ErrClosed
	}
	if waited {
		c.mu.Lock()
		if d := c.readTimeout; d > 0 {
			_ = c.Conn.SetReadDeadline(time.Now().Add(d))
		}
		c.mu.Unlock()
	}
	n, err := c.Conn.Read(p)
	c.gate.read(n)
	return n, err
}

func (c *gatedConn) SetReadDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *gatedConn) SetDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetDeadline(t)
}

func (c *gatedConn) remember(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.IsZero() {
		c.readTimeout = 0
		return
	}
	c.readTimeout = time.Until(t)
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
