package streamio

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// Not parallel: it pins the process-wide target of the client's logs.
func TestClientErrorsAreWarningsExceptTheRaceOfAConnectionIdemClosed(t *testing.T) {
	var buf bytes.Buffer
	RouteClientLogs(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { RouteClientLogs(slog.New(slog.DiscardHandler)) })

	// What the client logs each time a short-lived connection of idem's
	// (a lag query's) ends: seen every ten seconds in a healthy worker.
	router{}.Error("Error handling command response: %s - details: %s",
		"write tcp 127.0.0.1:46090->127.0.0.1:5552: use of closed network connection", "Socket write buffer closeFrameHandler")
	require.Contains(t, buf.String(), "level=DEBUG")
	require.NotContains(t, buf.String(), "level=WARN")

	buf.Reset()
	router{}.Error("Error handling command response: %s - details: %s", "write: broken pipe", "Socket write buffer closeFrameHandler")
	require.Contains(t, buf.String(), "level=WARN")
	buf.Reset()
	router{}.Error("Error during parsing ...: %s", "use of closed network connection")
	require.Contains(t, buf.String(), "level=WARN")
}
