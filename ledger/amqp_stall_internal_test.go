package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// stalledOutbox returns an executor that reaches the broker through a
// proxy the test can stall, closed when the test ends; dial, when not nil,
// is its Dial.
func stalledOutbox(t *testing.T, dial func(string) (*amqp.Connection, error)) (*AMQPExecutor, *testbroker.Proxy) {
	t.Helper()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	proxy := testbroker.NewProxy(t)
	ex, err := NewAMQPExecutor(AMQPConfig{URL: proxy.URL(), Dial: dial})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	t.Cleanup(proxy.Resume) // first: Close must not wait for a stalled broker
	return ex, proxy
}

// publishCall is a call that publishes body to queue q.
func publishCall(t *testing.T, id, q string, body []byte) Call {
	t.Helper()
	req, err := json.Marshal(Publishing{RoutingKey: q, Body: body})
	require.NoError(t, err)
	return Call{EffectID: id, Type: "evt", Request: req, Attempt: 1}
}

// executeWithin runs ex.Execute with a context of timeout and fails the
// test if it has not returned after bound.
func executeWithin(t *testing.T, ex *AMQPExecutor, c Call, timeout, bound time.Duration) (Result, error, time.Duration) {
	t.Helper()
	type result struct {
		res Result
		err error
	}
	out := make(chan result, 1)
	begin := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		res, err := ex.Execute(ctx, c)
		out <- result{res, err}
	}()
	select {
	case r := <-out:
		return r.res, r.err, time.Since(begin)
	case <-time.After(bound):
		t.Fatalf("Execute with a %s deadline still running after %s", timeout, bound)
		return Result{}, nil, 0
	}
}

func TestOutboxDialToAStalledBrokerEndsAtTheCallsDeadline(t *testing.T) {
	t.Parallel()
	ex, proxy := stalledOutbox(t, nil)
	proxy.Stall() // the TCP connect succeeds; the handshake never answers

	res, err, took := executeWithin(t, ex, publishCall(t, "e1", "nowhere", []byte(`1`)), 500*time.Millisecond, 5*time.Second)
	require.Equal(t, StatusFailedRetryable, res.Status, "nothing was sent")
	require.ErrorContains(t, err, "connect")
	require.Less(t, took, 3*time.Second)
}

func TestOutboxCallsDoNotWaitBehindAStuckDial(t *testing.T) {
	t.Parallel()
	ex, proxy := stalledOutbox(t, nil)
	proxy.Stall()

	// The first call dials, with a long deadline, and hangs in the handshake.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := make(chan Result, 1)
	go func() {
		res, _ := ex.Execute(ctx, publishCall(t, "e1", "nowhere", []byte(`1`)))
		first <- res
	}()
	require.Eventually(t, func() bool { return proxy.Accepted() == 1 }, 5*time.Second, time.Millisecond)

	// A second call waits for that dial only until its own deadline.
	res, err, took := executeWithin(t, ex, publishCall(t, "e2", "nowhere", []byte(`2`)), 300*time.Millisecond, 5*time.Second)
	require.Equal(t, StatusFailedRetryable, res.Status)
	require.ErrorContains(t, err, "connect")
	require.Less(t, took, 3*time.Second)

	// Cancelling the first call ends its dial at once.
	cancel()
	select {
	case res := <-first:
		require.Equal(t, StatusFailedRetryable, res.Status)
	case <-time.After(3 * time.Second):
		t.Fatal("a dial outlived the cancellation of its call by 3s")
	}
}

func TestOutboxPublishBlockedOnAStalledConnectionEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	// A small send buffer, so that a message of a few megabytes outgrows
	// what the sockets hold whatever the host's TCP settings.
	ex, proxy := stalledOutbox(t, func(u string) (*amqp.Connection, error) {
		return amqp.DialConfig(u, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			return c, c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		}})
	})
	res, err, _ := executeWithin(t, ex, publishCall(t, "e1", q, []byte(`1`)), 10*time.Second, 15*time.Second)
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, res.Status)

	// More than the sockets hold: the publish blocks in its write.
	proxy.Stall()
	big := bytes.Repeat([]byte{'x'}, 2<<20)
	res, err, took := executeWithin(t, ex, publishCall(t, "e2", q, big), 2*time.Second, 10*time.Second)
	require.Equal(t, StatusUnknown, res.Status, "part of the message may have left: %v", err)
	require.ErrorContains(t, err, "publish still writing when its deadline came")
	require.Less(t, took, 5*time.Second)
	t.Logf("publish blocked on a stalled connection returned after %s: %v", took.Round(time.Millisecond), err)

	// The executor dials again once the broker answers.
	proxy.Resume()
	res, err, _ = executeWithin(t, ex, publishCall(t, "e3", q, []byte(`3`)), 10*time.Second, 15*time.Second)
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, res.Status)
}
