package deadletters_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testbroker"
)

// AMQP 0-9-1 methods a stallProxy can stop at: class id << 16 | method id.
const (
	basicGet     = 60<<16 | 70
	basicPublish = 60<<16 | 40
)

// stallProxy forwards one AMQP connection to the broker until the client
// sends the method it waits for; from then on nothing more the client sends
// reaches the broker, while the broker's frames (heartbeats) still reach the
// client. That is RabbitMQ during a memory or disk alarm, as the client sees
// it: the connection stays up and nothing is ever answered. stalled closes
// when the proxy stops forwarding.
type stallProxy struct {
	ln      net.Listener
	method  uint32
	stalled chan struct{}
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, method uint32) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, method: method, stalled: make(chan struct{})}
	u, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	p.wg.Add(1)
	go p.serve(u.Host)
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

// URL is the broker URL with the proxy's address.
func (p *stallProxy) URL() string {
	u, _ := url.Parse(testbroker.URL())
	u.Host = p.ln.Addr().String()
	return u.String()
}

// serve proxies the first connection only, then ends when it does.
func (p *stallProxy) serve(target string) {
	defer p.wg.Done()
	client, err := p.ln.Accept()
	if err != nil {
		return
	}
	defer client.Close()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer server.Close()
	go func() { // broker to client, always
		_, _ = io.Copy(client, server)
		_ = client.Close()
	}()
	p.forward(server, client)
}

// forward copies the client's protocol header, then its frames, until the
// awaited method; after it, it reads and drops everything, so the client's
// close is still seen.
func (p *stallProxy) forward(server io.Writer, client io.Reader) {
	in := bufio.NewReader(client)
	header := make([]byte, 8) // "AMQP" 0 0 9 1
	if _, err := io.ReadFull(in, header); err != nil {
		return
	}
	if _, err := server.Write(header); err != nil {
		return
	}
	for {
		head := make([]byte, 7) // type, channel, size
		if _, err := io.ReadFull(in, head); err != nil {
			return
		}
		frame := make([]byte, 7+binary.BigEndian.Uint32(head[3:])+1) // payload, frame-end
		copy(frame, head)
		if _, err := io.ReadFull(in, frame[7:]); err != nil {
			return
		}
		if frame[0] == 1 && len(frame) >= 12 && binary.BigEndian.Uint32(frame[7:11]) == p.method {
			close(p.stalled)
			_, _ = io.Copy(io.Discard, in)
			return
		}
		if _, err := server.Write(frame); err != nil {
			return
		}
	}
}

// waitStalled waits until the proxy stopped forwarding.
func (p *stallProxy) waitStalled(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case <-p.stalled:
	case err := <-done:
		t.Fatalf("Redrive returned before the broker stalled: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy never saw the method it stalls at")
	}
}

// dlqHolds waits until the dead-letter queue holds want messages again
// (they return to it when the redrive connection is gone) and checks them.
func (e *env) dlqHolds(want ...string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info, err := e.ch.QueueDeclarePassive(e.queue+".dlq", true, false, false, false, nil)
		return err == nil && info.Messages == len(want)
	}, 15*time.Second, 20*time.Millisecond, "the unacked messages return to the dead-letter queue")
	require.Equal(e.t, want, ids(e.drain(e.queue+".dlq")))
	require.Empty(e.t, e.redriven(), "and no row is marked")
}

// returnsWithin bounds how long Redrive may take once cancelled or once its
// broker call timed out: without the bounds it waits for the broker's
// heartbeat timeout (tens of seconds), or for good.
const returnsWithin = 5 * time.Second

func TestRedriveReturnsWhenCancelledWhileTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	for name, method := range map[string]uint32{"get": basicGet, "publish": basicPublish} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declare(nil)
			e.deadLetter("billing", "m-1", "max_attempts")
			proxy := newStallProxy(t, method)
			o := e.options()
			o.AMQPURL = proxy.URL()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := deadletters.Redrive(ctx, o)
				done <- err
			}()
			proxy.waitStalled(t, done)
			time.Sleep(100 * time.Millisecond) // Redrive waits on the broker now
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(returnsWithin):
				t.Fatalf("Redrive still runs %s after its context was cancelled", returnsWithin)
			}
			e.dlqHolds("m-1")
			require.Empty(t, e.drain(e.queue), "the stalled publish never reached the queue")
		})
	}
}

func TestRedriveGivesUpOnABrokerThatStopsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	e.deadLetter("billing", "m-1", "max_attempts")
	proxy := newStallProxy(t, basicGet)
	o := e.options()
	o.AMQPURL = proxy.URL()
	deadletters.SetBrokerTimeout(&o, time.Second)
	start := time.Now()
	_, err := deadletters.Redrive(context.Background(), o)
	require.ErrorContains(t, err, "no answer from the broker within 1s")
	require.Less(t, time.Since(start), returnsWithin)
	e.dlqHolds("m-1")
}
