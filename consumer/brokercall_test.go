package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// AMQP methods the broker sends after which its proxy goes deaf.
const (
	connectionClass, connectionOpenOK = 10, 41
	basicClass, basicQosOK            = 60, 11
)

// deafBroker is a proxy to the broker that, once the broker sent the method
// (class, method), drops what the client sends: the broker never sees the
// client's next request, and the client waits for an answer that never
// comes, as behind a half-open socket or a broker that stopped answering.
// What the broker sends still flows, heartbeats included, so the client's
// own heartbeat check ends nothing (the broker's ends the connection only
// after about 20 s).
func deafBroker(t *testing.T, class, method uint16) *testbroker.Proxy {
	return testbroker.NewProxy(t, testbroker.DeafAtMethod(faultproxy.Target, class, method))
}

// testSource is a queueSource on queue q through url, without an engine: enough
// to connect, declare and consume.
func testSource(t *testing.T, url, q string, commitTimeout time.Duration) *queueSource {
	return newQueueSource(Config{
		Name: "brokercall", AMQPURL: url, ConnectionName: "idem-test-" + q,
		Queue: q, RetryQueue: q + ".retry", DeadLetterQueue: q + ".dlq", QueueType: "classic",
		Topology: Declare, Prefetch: 10, Workers: 1, BatchMaxSize: 10, MaxBufferedBytes: 1 << 20,
		CommitTimeout: commitTimeout, Logger: slog.New(slog.DiscardHandler),
	}, nil, nil)
}

// within runs f and fails the test unless it returns within limit.
func within[T any](t *testing.T, limit time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(limit):
		t.Fatalf("%s did not return within %s", what, limit)
		var zero T
		return zero
	}
}

// The client waits for the answer to a synchronous method (channel.open,
// queue.declare, basic.qos, confirm.select, basic.consume, basic.cancel)
// with neither a timer nor a context. A broker that stops answering must
// cost a session CommitTimeout, not the worker's liveness; and Declare
// must end with its context.
func TestBrokerCallsEndWhenTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	const limit = 10 * time.Second // the broker's heartbeat check takes about 20 s

	t.Run("session setup", func(t *testing.T) {
		t.Parallel()
		p := deafBroker(t, connectionClass, connectionOpenOK) // channel.open hangs
		src := testSource(t, p.URL(), testbroker.Queue(t), 300*time.Millisecond)
		ctx := context.Background()
		err := within(t, limit, "connect", func() error {
			s, err := src.connect(ctx, ctx, 1)
			if err == nil {
				s.close()
			}
			return err
		})
		require.ErrorContains(t, err, "no answer from the broker within 300ms")
	})

	t.Run("declare ends with its context", func(t *testing.T) {
		t.Parallel()
		p := deafBroker(t, connectionClass, connectionOpenOK)
		src := testSource(t, p.URL(), testbroker.Queue(t), time.Hour)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err := within(t, limit, "Declare", func() error { return src.Declare(ctx) })
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("consume", func(t *testing.T) {
		t.Parallel()
		p := deafBroker(t, basicClass, basicQosOK) // basic.consume hangs
		src := testSource(t, p.URL(), testbroker.Queue(t), 300*time.Millisecond)
		ctx := context.Background()
		s, err := src.connect(ctx, ctx, 1)
		require.NoError(t, err)
		defer s.close()
		err = within(t, limit, "serve", func() error { return src.serve(ctx, s) })
		require.ErrorContains(t, err, "no answer from the broker within 300ms")
	})
}

// The client closes the channels of NotifyCancel whenever the AMQP channel
// or connection closes; a session whose channel the broker closed must say
// why, not that the broker cancelled its consumer. A real cancel (the queue
// was deleted) is still reported as one.
func TestSessionEndReportsWhyTheChannelClosed(t *testing.T) {
	t.Parallel()
	q := testbroker.Queue(t)
	src := testSource(t, testbroker.URL(), q, 10*time.Second)
	ctx := context.Background()
	open := func() (*session, signals) {
		s, err := src.connect(ctx, ctx, 1)
		require.NoError(t, err)
		t.Cleanup(s.close)
		return s, s.notifications()
	}
	for range 20 {
		s, sig := open()
		closed := s.ch.NotifyCancel(make(chan string, 1)) // closed after sig's
		require.NoError(t, s.ch.Ack(1<<40, false))        // unknown tag: the broker closes the channel
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the broker did not close the channel")
		}
		// Every signal is ready now (the close error, the closed cancel
		// notifications); select picks one at random: hence 20 rounds.
		r := &router{src: src, s: s}
		err := within(t, 10*time.Second, "loop", func() error { return r.loop(ctx, make(chan amqp.Delivery), sig) })
		require.ErrorContains(t, err, "channel closed")
		require.ErrorContains(t, err, "PRECONDITION_FAILED")
	}

	s, sig := open()
	deliveries, err := s.ch.Consume(q, "", false, false, false, false, nil)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() { ended <- (&router{src: src, s: s}).loop(ctx, deliveries, sig) }()
	_, err = testbroker.Channel(t).QueueDelete(q, false, false, false)
	require.NoError(t, err)
	select {
	case err := <-ended:
		require.ErrorContains(t, err, "broker cancelled the consumer")
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end when its queue was deleted")
	}
}
