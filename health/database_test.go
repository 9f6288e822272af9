package health_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// runProbe runs p until the test ends.
func runProbe(t *testing.T, p *health.Database) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// within waits until the probe's readiness is want, and returns how long
// that took.
func within(t *testing.T, p *health.Database, want bool, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, want, p.Health().Ready, "%+v", p.Health())
	}, limit, 20*time.Millisecond)
	return time.Since(start)
}

// A database that refuses connections, or stops answering on the open one
// (a blackholed link), makes the probe not ready within seconds; it is
// ready again once the database answers.
func TestDatabaseProbeIsNotReadyWithinSecondsOfARefusalOrASilence(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(*faultproxy.Proxy){
		"refused":    (*faultproxy.Proxy).Refuse,
		"blackholed": (*faultproxy.Proxy).Stall,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, proxy := testdb.Proxied(t)
			p := health.NewDatabase(pool, "test database")
			require.False(t, p.Health().Ready, "not probed before Run")
			runProbe(t, p)
			within(t, p, true, 5*time.Second)
			require.True(t, p.Health().Live)

			fail(proxy)
			took := within(t, p, false, 10*time.Second)
			t.Logf("not ready %s after the database went %s: %s", took.Round(time.Millisecond), name, p.Health().Reason)
			require.Contains(t, p.Health().Reason, "database:")
			require.True(t, p.Health().Live, "a database outage is no reason to restart")

			proxy.Resume()
			within(t, p, true, 10*time.Second)
		})
	}
}

// A session that cannot write (a standby after a failover) is not ready.
func TestDatabaseProbeIsNotReadyOnAReadOnlySession(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	cfg := pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	p := health.NewDatabaseProbe(cfg, "standby", 50*time.Millisecond, time.Second)
	runProbe(t, p)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		s := p.Health()
		assert.False(c, s.Ready)
		assert.Contains(c, s.Reason, "read-only")
	}, 5*time.Second, 20*time.Millisecond)
}

// A probe of a multi-host URL whose first host accepts connections and
// never answers is ready while another host takes writes, and not ready,
// naming each host, once that host stops answering too.
func TestDatabaseProbeIsReadyThroughAnyHostOfAMultiHostURL(t *testing.T) {
	t.Parallel()
	pool, proxy := testdb.Proxied(t)
	cfg := pool.Config().ConnConfig.Copy()
	silent := faultproxy.New(t, proxy.Addr())
	silent.Stall()
	host, port, err := net.SplitHostPort(silent.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port}}
	cfg.Host, cfg.Port = host, uint16(p)
	cfg.ConnectTimeout = 0 // as a URL without connect_timeout

	probe := health.NewDatabaseProbe(cfg, "test database", 100*time.Millisecond, time.Second)
	runProbe(t, probe)
	within(t, probe, true, 10*time.Second)

	proxy.Stall()
	within(t, probe, false, 10*time.Second)
	reason := probe.Health().Reason
	require.Contains(t, reason, silent.Addr()+": no answer within 1s")
	require.Contains(t, reason, proxy.Addr()+": ")

	proxy.Resume()
	within(t, probe, true, 10*time.Second)
}
