package main

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

func TestCaptureRequestMessageContinuesTheRequestsTrace(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	req := newCaptureRequest(e.url, "acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR"))
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	id := e.do(req).id(t)
	e.waitPublished(id)

	m, ok, err := testbroker.Channel(t).Get(e.queue, true)
	require.NoError(t, err)
	require.True(t, ok, "the capture request is in the queue")
	tp, _ := m.Headers["traceparent"].(string)
	parts := strings.Split(tp, "-")
	require.Len(t, parts, 4, "traceparent %q", tp)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", parts[1], "the worker continues the API request's trace")
}

// One trace from the message to the external call: a capture request
// published with a traceparent makes the gateway's capture call carry a
// traceparent of the same trace, with the worker's default configuration
// (no OpenTelemetry SDK, no propagator set, no environment variable).
func TestCaptureCallContinuesTheTraceOfTheMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	require.NoError(t, e.ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
		MessageId: "m-traced", CorrelationId: "corr-traced", Body: []byte(body("cr-traced", 100)),
		ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{"traceparent": "00-" + traceID + "-b7ad6b7169203331-01"},
	}))
	select {
	case tp := <-e.traceparents:
		parts := strings.Split(tp, "-")
		require.Len(t, parts, 4, "traceparent %q", tp)
		require.Equal(t, traceID, parts[1], "the capture call continues the message's trace")
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway was never called")
	}
}
