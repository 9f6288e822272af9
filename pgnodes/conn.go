package pgnodes

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// closeGrace bounds what pgx waits for on a connection it is closing after
// a cancelled statement (its Terminate, then the server's own close): a
// server that stopped answering would hold the connection, and so its
// pool slot, for 15 s, and a pool whose slots are all held cannot open a
// connection to the next host.
const closeGrace = time.Second

// silentFor is how long a host whose connection got no first byte within
// the connect timeout stays suspect, and silentBound the first-byte bound
// of a new connection to a suspect host: a host that froze costs each new
// connection half a second, not the connect timeout, before the next host
// is tried, while one that came back still gets its connections.
// silentAfter is how long a new connection may wait for its first byte
// before giving up on it (its caller's deadline, say) makes its host
// suspect too: a server answers a connection in milliseconds.
const (
	silentFor   = 10 * time.Second
	silentBound = 500 * time.Millisecond
	silentAfter = 1500 * time.Millisecond
)

// dialer returns a DialFunc whose TCP connections are bounded by timeout
// and abandoned when the peer stops acknowledging (keepalives, user
// timeout), and whose connections are watched (see conn).
func dialer(timeout time.Duration) pgconn.DialFunc {
	d := &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepaliveIdle, Interval: keepaliveInterval, Count: keepaliveCount,
		},
		Control: setUserTimeout,
	}
	s := &silence{until: map[string]time.Time{}, open: map[string]map[*conn]struct{}{}}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Until the server sends its first byte, the connection lives
		// about timeout at most (silentBound for a suspect host): a connection
		// attempt is bounded by the connect timeout anyway, and the cancel
		// request pgx sends on a connection of its own when a statement is
		// cancelled (it waits for the server to close that connection, for
		// up to 15 s) is bounded too.
		bound := timeout - timeout/10 // before the connect timeout, to see it
		if s.suspect(addr) {
			bound = min(bound, silentBound)
		}
		if err := c.SetDeadline(time.Now().Add(bound)); err != nil {
			_ = c.Close()
			return nil, err
		}
		wc := &conn{Conn: c, provisional: true, addr: addr, silence: s, dialed: time.Now()}
		s.opened(wc)
		return wc, nil
	}
}

// silence remembers the hosts (addresses) whose connections got no first
// byte in time, and the connections open to each host: when a host turns
// suspect, the statements waiting on its connections are cut (see
// conn.cut), as a host that does not answer a new connection will not
// answer them either. A pool whose connections went to a primary that
// froze then retries on the next host within seconds, instead of waiting
// for each statement's deadline.
type silence struct {
	mu    sync.Mutex
	until map[string]time.Time
	open  map[string]map[*conn]struct{}
}

func (s *silence) opened(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[c.addr] == nil {
		s.open[c.addr] = map[*conn]struct{}{}
	}
	s.open[c.addr][c] = struct{}{}
}

func (s *silence) closed(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open[c.addr], c)
	if len(s.open[c.addr]) == 0 {
		delete(s.open, c.addr)
	}
}

func (s *silence) suspect(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.until[addr]
	if ok && time.Now().After(u) {
		delete(s.until, addr)
		return false
	}
	return ok
}

// mark makes addr suspect and cuts what its open connections wait for.
func (s *silence) mark(addr string) {
	s.mu.Lock()
	s.until[addr] = time.Now().Add(silentFor)
	open := make([]*conn, 0, len(s.open[addr]))
	for c := range s.open[addr] {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.cut()
	}
}

func (s *silence) clear(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.until, addr)
}

// conn is a dialled connection that bounds the two waits pgx has no bound
// for but 15 s: the first byte of a server (see dialer), and closing after
// an interrupted statement (closeGrace).
type conn struct {
	net.Conn

	addr    string
	silence *silence
	dialed  time.Time
	reading atomic.Int32 // Reads in progress

	mu          sync.Mutex
	provisional bool        // the dial's deadline is set; the first byte read lifts it
	interrupted bool        // pgx interrupted a call with a deadline that passed
	settled     atomic.Bool // !provisional, for Read without the lock
	established atomic.Bool // !provisional, for cut, without the lock
}

// establish lifts the dial's deadline's hold: the server answered, or pgx
// sets deadlines of its own. Called with mu held.
func (c *conn) establish() {
	c.provisional = false
	c.established.Store(true)
}

// Read lifts the dial's deadline once the server has sent something,
// unless pgx set deadlines of its own meanwhile; a server that sent
// nothing before it passed makes the host suspect.
func (c *conn) Read(b []byte) (int, error) {
	c.reading.Add(1)
	n, err := c.Conn.Read(b)
	c.reading.Add(-1)
	if c.settled.Load() {
		return n, err // the hot path: the dial's deadline is gone
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.provisional {
		c.settled.Store(true)
		return n, err
	}
	var ne net.Error
	switch {
	case n > 0:
		c.establish()
		_ = c.Conn.SetDeadline(time.Time{})
		c.silence.clear(c.addr)
	case errors.As(err, &ne) && ne.Timeout():
		c.silence.mark(c.addr)
	}
	return n, err
}

// SetDeadline passes pgx's deadline on, and notes an interruption (a
// deadline that has passed: pgx's cancellation of a call); after one, a
// later deadline further than closeGrace away is brought to closeGrace:
// the connection is being closed.
func (c *conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	waited := c.provisional // for the server's first byte
	c.establish()
	now := time.Now()
	switch {
	case t.IsZero():
	case !t.After(now):
		c.interrupted = true
		if waited && now.Sub(c.dialed) >= silentAfter {
			c.silence.mark(c.addr) // given up on, after a silence no server keeps
		}
	case c.interrupted && t.After(now.Add(closeGrace)):
		t = now.Add(closeGrace)
	}
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline passes pgx's deadline on; the dial's is gone.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.establish()
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline passes pgx's deadline on; the dial's is gone.
func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.establish()
	return c.Conn.SetWriteDeadline(t)
}

// Close closes the connection and forgets it.
func (c *conn) Close() error {
	c.silence.closed(c)
	return c.Conn.Close()
}

// cut ends a Read in progress on an established connection whose host
// turned suspect: it fails at once, as at a deadline, and pgx closes the
// connection, so that its statement fails and is retried on another host.
// A connection not reading (idle in a pool) is left alone: the pool pings
// it before it hands it out again.
func (c *conn) cut() {
	if c.established.Load() && c.reading.Load() > 0 {
		_ = c.Conn.SetReadDeadline(time.Now())
	}
}

// NetConn is the TCP (or Unix) connection underneath, as tls.Conn names
// its own.
func (c *conn) NetConn() net.Conn { return c.Conn }
