package consumer

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testbroker"
)

func TestHealthIsReadyOnlyWhileConsuming(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), nil)
	h := c.Health()
	require.False(t, h.Ready)
	require.True(t, h.Live)
	require.Contains(t, h.Reason, "not running")

	stop := start(t, c)
	waitFor(t, 10*time.Second, "ready", func() bool { return c.Health().Ready })
	require.True(t, c.Health().Live)
	require.Empty(t, c.Health().Reason)
	stop()
	require.False(t, c.Health().Ready)
	require.True(t, c.Health().Live, "a clean shutdown is not a failure")
}

func TestHealthIsNotReadyWhileTheBrokerIsUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:1/" })
	start(t, c)
	waitFor(t, 10*time.Second, "the first dial failed", func() bool { return c.Health().Reason != "not running" && c.Health().Reason != "connecting" })
	h := c.Health()
	require.False(t, h.Ready)
	require.True(t, h.Live, "reconnecting is progress")
	require.Contains(t, h.Reason, "broker unavailable")
}

// A wrong password is not an outage: Run fails at the first dial with a
// clear error instead of retrying forever, and the consumer reports not live.
func TestWrongCredentialsFailFastAtTheFirstDial(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	u, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("guest", "not-the-password")
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = u.String() })
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		require.Contains(t, err.Error(), "username or password not allowed")
		require.NotContains(t, err.Error(), "not-the-password")
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept retrying a refused login")
	}
	h := c.Health()
	require.False(t, h.Live)
	require.False(t, h.Ready)
	require.Contains(t, h.Reason, "stopped")
}
