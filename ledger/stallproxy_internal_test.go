package ledger

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallProxy forwards TCP connections to a target and can be told to stall:
// it then stops passing bytes, in both directions and on every connection,
// old and new, without closing any socket, the way a failover that resets
// nothing or a dead peer behind a firewall looks to a client. Resume passes
// the held bytes on.
type stallProxy struct {
	ln       net.Listener
	target   string
	wg       sync.WaitGroup
	accepted atomic.Int64 // connections accepted so far

	mu    sync.Mutex
	gate  chan struct{} // closed while bytes pass; open while stalled
	conns []net.Conn
}

// newStallProxy starts a proxy in front of target (host:port); it resumes
// and stops when the test ends.
func newStallProxy(t testing.TB, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("stall proxy: listen: %v", err)
	}
	p := &stallProxy{ln: ln, target: target, gate: make(chan struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Resume()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// Stall stops passing bytes; sockets stay open.
func (p *stallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

// Resume passes bytes again, the held ones first.
func (p *stallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// pass waits while the proxy is stalled.
func (p *stallProxy) pass() {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	<-gate
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		// Small buffers: a stalled proxy takes few bytes off its client
		// before the client's writes block.
		_ = client.(*net.TCPConn).SetReadBuffer(64 << 10)
		p.accepted.Add(1)
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.pass()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
}
