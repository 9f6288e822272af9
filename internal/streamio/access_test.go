package streamio

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/stretchr/testify/require"
)

// withCredentials returns the test broker's stream URI with user, password
// and vhost replaced.
func withCredentials(t *testing.T, user, password, vhost string) string {
	t.Helper()
	u, err := url.Parse(URLFromEnv())
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	u.Path = "/" + vhost
	return u.String()
}

func TestOpenFailsAtTheFirstDialWhenTheBrokerRefusesAccess(t *testing.T) {
	t.Parallel()
	openEnv(t) // skips or fails when the broker is unreachable
	guest, _ := url.Parse(URLFromEnv())
	pw, _ := guest.User.Password()
	for _, c := range []struct {
		uri, why string
	}{
		{withCredentials(t, guest.User.Username(), "wrong-s3cret", ""), "check the user name and password"},
		{withCredentials(t, "no-such-user", "wrong-s3cret", ""), "check the user name and password"},
		{withCredentials(t, guest.User.Username(), pw, "no-such-vhost"), "the virtual host does not exist"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := Open(ctx, Config{URI: c.uri})
		cancel()
		require.ErrorIs(t, err, ErrAccessRefused, c.uri)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "refused at the first dial, not retried")
		require.ErrorContains(t, err, c.why)
		require.NotContains(t, err.Error(), "wrong-s3cret")
	}
	// A broker that is not there is not an access error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Open(ctx, Config{URI: "rabbitmq-stream://guest:guest@127.0.0.1:1/"})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrAccessRefused), err.Error())
}

// Not parallel: it changes where the process's client logs go, and puts it
// back before the parallel tests run.
func TestClientLogsGoToTheLoggerOpenWasGiven(t *testing.T) {
	openEnv(t)
	previous := target.Load()
	defer func() {
		target.Store(previous)
		pinned.Store(true)
	}()
	pinned.Store(false)

	var buf testrun.LogBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Open(ctx, Config{URI: withCredentials(t, "guest", "wrong-s3cret", ""), Logger: logger})
	require.ErrorIs(t, err, ErrAccessRefused)
	out := buf.String()
	require.Contains(t, out, "component=rabbitmq-stream")
	require.Contains(t, out, "Can't connect to the broker", "the client's own error line, through the Env's logger")
	require.Contains(t, out, "level=WARN", "the client's errors are lowered to warnings")
	require.NotContains(t, out, "wrong-s3cret")

	// Pinned by RouteClientLogs, the target no longer follows Open.
	var pinnedBuf testrun.LogBuffer
	RouteClientLogs(slog.New(slog.NewTextHandler(&pinnedBuf, nil)))
	_, err = Open(ctx, Config{URI: withCredentials(t, "guest", "wrong-s3cret", ""), Logger: logger})
	require.ErrorIs(t, err, ErrAccessRefused)
	require.Equal(t, 1, strings.Count(buf.String(), "Can't connect to the broker"))
	require.Contains(t, pinnedBuf.String(), "Can't connect to the broker")
}
