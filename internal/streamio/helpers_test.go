package streamio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testdb"
)

// openEnv connects to the test broker's stream port, or ends the test the
// way testdb.Unavailable does.
func openEnv(tb testing.TB) *Env {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := Open(ctx, Config{URI: URLFromEnv()})
	if err != nil {
		testdb.Unavailable(tb, "RabbitMQ stream port", err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// newStream declares a stream unique to the test and deletes it at cleanup.
func newStream(tb testing.TB, e *Env) string {
	tb.Helper()
	name := testdb.Name(tb, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(tb, e.DeclareStream(ctx, name, StreamOptions{}))
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.DeleteStream(ctx, name); err != nil && !errors.Is(err, ErrStreamNotFound) {
			tb.Logf("delete stream %s: %v", name, err)
		}
	})
	return name
}

// messages returns n messages with ids prefix-0 … prefix-(n-1).
func messages(prefix string, n int) []Outgoing {
	out := make([]Outgoing, n)
	for i := range out {
		out[i] = Outgoing{MessageID: fmt.Sprintf("%s-%d", prefix, i), Body: []byte(fmt.Sprintf("body %s %d", prefix, i))}
	}
	return out
}

// collector gathers what fn receives, checking batch sizes and order.
type collector struct {
	tb       testing.TB
	maxBatch int
	mu       sync.Mutex
	records  []Record
	batches  int
}

func (c *collector) fn(_ context.Context, batch []Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	if c.maxBatch > 0 && len(batch) > c.maxBatch {
		c.tb.Errorf("batch of %d records, max %d", len(batch), c.maxBatch)
	}
	for _, r := range batch {
		if n := len(c.records); n > 0 && r.Offset != c.records[n-1].Offset+1 {
			c.tb.Errorf("offset %d follows %d", r.Offset, c.records[n-1].Offset)
		}
		c.records = append(c.records, r)
	}
	return nil
}

func (c *collector) snapshot() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.records...)
}

func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.MessageID
	}
	return out
}

func idsOf(msgs []Outgoing) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.MessageID
	}
	return out
}

// proxy forwards TCP connections to the broker's stream port so that a test
// can sever them (testbroker.Proxy does the same for the AMQP port).
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// newProxy starts a proxy to target (host:port), stopped at cleanup.
func newProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	p := &proxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(client, server)
			go p.pipe(server, client)
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.sever()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// sever closes every connection open now.
func (p *proxy) sever() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// uri is URLFromEnv with the host replaced by the proxy's address.
func (p *proxy) uri(tb testing.TB) string {
	u, err := url.Parse(URLFromEnv())
	require.NoError(tb, err)
	u.Host = p.ln.Addr().String()
	return u.String()
}
