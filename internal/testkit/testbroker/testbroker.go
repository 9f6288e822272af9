// Package testbroker gives idem's own tests a real RabbitMQ: the URL, a
// connection closed at the end of the test, uniquely named queues, and a TCP
// proxy that a test can sever or stall to simulate a dropped connection or a
// broker that stopped answering, without touching other tests running in
// parallel, and a TLS proxy that stands for a broker listening for amqps.
package testbroker

import (
	"net/url"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// DefaultURL is used when IDEM_AMQP_URL is not set.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns IDEM_AMQP_URL or DefaultURL.
func URL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Dial opens a connection for the test and closes it when the test ends. An
// unreachable broker skips the test, or fails it under CI=true.
func Dial(tb testing.TB) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		testdb.Unavailable(tb, "RabbitMQ", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on a fresh test connection.
func Channel(tb testing.TB) *amqp.Channel {
	tb.Helper()
	ch, err := Dial(tb).Channel()
	if err != nil {
		tb.Fatalf("testbroker: open channel: %v", err)
	}
	return ch
}

// Queue returns a queue name unique to this test; every queue whose name
// starts with it is deleted when the test ends (the name itself, and the
// retry and dead-letter queues idem declares next to it).
func Queue(tb testing.TB) string {
	tb.Helper()
	name := testdb.Name(tb, "q")
	tb.Cleanup(func() {
		conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return
		}
		defer conn.Close()
		for _, q := range amqpnames.Queues(name, 0) {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	})
	return name
}

// FullQueue declares on ch a queue unique to this test (see Queue) that
// holds one message and rejects what is published to it beyond that: the
// broker nacks those publishes until a message is taken off it.
func FullQueue(tb testing.TB, ch *amqp.Channel) string {
	tb.Helper()
	q := Queue(tb)
	if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}); err != nil {
		tb.Fatalf("testbroker: declare %s: %v", q, err)
	}
	return q
}

// PartitionsAtEnd deletes, when the test ends, what a consumer of queue
// with n partitions declares: the exchange named queue, its
// partition and retry queues, and its dead-letter queue.
func PartitionsAtEnd(tb testing.TB, queue string, n int) {
	tb.Cleanup(func() {
		conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return
		}
		defer conn.Close()
		for _, q := range amqpnames.Queues(queue, n) {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
				_ = ch.Close()
			}
		}
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(amqpnames.PartitionExchange(queue), false, false)
			_ = ch.Close()
		}
	})
}

// Proxy forwards TCP connections to the broker and can fail them for one
// test: see faultproxy.Proxy for Sever, Stall, StallOpen, Resume and Stalled.
type Proxy struct {
	*faultproxy.Proxy
}

// NewProxy starts a proxy in front of the broker's AMQP port and returns
// it; the proxy stops when the test ends. Use its URL in place of URL().
func NewProxy(tb testing.TB, opts ...faultproxy.Option) *Proxy {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("testbroker: parse url: %v", err)
	}
	return NewProxyTo(tb, u.Host, opts...)
}

// NewProxyTo starts a proxy in front of target (host:port), such as the
// broker's stream port; the proxy stops when the test ends. Connect to Addr.
func NewProxyTo(tb testing.TB, target string, opts ...faultproxy.Option) *Proxy {
	tb.Helper()
	return &Proxy{faultproxy.New(tb, target, opts...)}
}

// URL is the broker URL with the host replaced by the proxy's address.
func (p *Proxy) URL() string {
	u, _ := url.Parse(URL())
	u.Host = p.Addr()
	return u.String()
}
