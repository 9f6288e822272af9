package main

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// A worker whose IDEM_PG_URL lists first a host that accepts connections
// and never answers, without connect_timeout in the URL, starts, is ready
// within 20 s, and applies every deposit once through the second host; it
// stays ready while it does.
func TestWorkerBehindASilentFirstHostStartsAndIsReadyWhileItApplies(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t) // skips, or fails under CI, without PostgreSQL
	testbroker.Dial(t)     // the same for RabbitMQ
	schema := testdb.Name(t, "qs")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
	o := options{pgURL: testdb.URLAfterSilentHost(t), amqpURLs: []string{testbroker.URL()}, queue: testbroker.Queue(t),
		schema: schema, n: 500, dup: 0.3, accounts: 7, healthAddr: freeAddr(t)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	start := time.Now()
	testrun.Start(t, func(ctx context.Context) error { return worker(ctx, o, quiet) })
	testrun.WaitFor(t, 20*time.Second, "the worker ready (GET /readyz answers 200)", func() bool { return ready(o.healthAddr) })
	t.Logf("ready %s after the start", time.Since(start).Round(time.Millisecond))

	ctx := context.Background()
	pub, err := publish(ctx, o, quiet)
	require.NoError(t, err)
	tables := idem.Tables{Schema: schema}
	notReady := 0
	testrun.WaitFor(t, time.Minute, "every distinct deposit applied", func() bool {
		if !ready(o.healthAddr) {
			notReady++
		}
		got, _ := balances(ctx, pool, tables)
		return maps.Equal(got, pub.expected)
	})
	require.Zero(t, notReady, "GET /readyz answered other than 200 while deposits were applied")
}

// freeAddr is a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// ready reports whether GET /readyz at addr answers 200.
func ready(addr string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
