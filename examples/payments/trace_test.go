package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testbroker"
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
