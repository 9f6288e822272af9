package pgnodes_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/pgnodes"
)

// A first host that accepts connections and never answers, in a URL that
// sets no connect_timeout, costs a pool of ParseConfig one connect timeout:
// the second host serves. (A pool of pgxpool.ParseConfig waits on the first
// host until the caller's deadline.)
func TestAPoolGivesUpOnASilentFirstHostAndUsesTheNext(t *testing.T) {
	t.Parallel()
	url := testdb.URLAfterSilentHost(t)
	pool, err := pgnodes.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The deadline is ten connect timeouts: without a bound per host, the
	// first host would hold the connection until it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*pgnodes.DefaultConnectTimeout)
	defer cancel()
	start := time.Now()
	var one int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	t.Logf("connected through the second host in %s", time.Since(start).Round(time.Millisecond))

	// The first host sent nothing: it is suspect, and the next new
	// connection gives it half a second, not the connect timeout.
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	ctx, cancel = context.WithTimeout(context.Background(), pgnodes.DefaultConnectTimeout/2)
	defer cancel()
	second, err := pool.Acquire(ctx)
	require.NoError(t, err, "a second connection, while the first is held")
	second.Release()
}

// What the URL sets wins over the defaults; what it does not set gets them.
func TestParseConfigKeepsWhatTheURLSets(t *testing.T) {
	t.Parallel()
	cfg, err := pgnodes.ParseConfig("postgres://u@h1,h2/db?sslmode=disable")
	require.NoError(t, err)
	require.Equal(t, pgnodes.DefaultConnectTimeout, cfg.ConnConfig.ConnectTimeout)
	require.Equal(t, pgnodes.DefaultPingTimeout, cfg.PingTimeout)
	require.NotNil(t, cfg.ConnConfig.DialFunc)

	cfg, err = pgnodes.ParseConfig("postgres://u@h1,h2/db?sslmode=disable&connect_timeout=7&pool_ping_timeout=5s")
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, cfg.ConnConfig.ConnectTimeout)
	require.Equal(t, 5*time.Second, cfg.PingTimeout)
}

// A string that cannot be parsed is refused without quoting its password.
func TestParseConfigErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"postgres://u:s3cr3t-pa55@h:99999/db",
		"postgres://u:s3cr3t-pa55@h/db?connect_timeout=soon",
		"host=h password=s3cr3t-pa55 connect_timeout=-1",
	} {
		_, err := pgnodes.ParseConfig(s)
		require.Error(t, err, s)
		require.NotContains(t, err.Error(), "s3cr3t-pa55")
	}
}

// Hosts gives one config per host, in the URL's order, each with the TLS
// and plain attempts sslmode=prefer makes for it and nothing of the other
// hosts.
func TestHostsSplitsAMultiHostConfigByHost(t *testing.T) {
	t.Parallel()
	cfg, err := pgnodes.ParseConfig("postgres://u@pg1:5432,pg2:5433,pg3/db?sslmode=prefer&target_session_attrs=read-write")
	require.NoError(t, err)
	hosts := pgnodes.Hosts(cfg.ConnConfig)
	require.Len(t, hosts, 3)
	for i, want := range []string{"pg1:5432", "pg2:5433", "pg3:5432"} {
		h := hosts[i]
		require.Equal(t, want, h.Host+":"+strconv.Itoa(int(h.Port)))
		require.NotNil(t, h.TLSConfig, "the TLS attempt first")
		require.Len(t, h.Fallbacks, 1, "then the plain attempt")
		require.Equal(t, h.Host, h.Fallbacks[0].Host)
		require.Nil(t, h.Fallbacks[0].TLSConfig)
		require.NotNil(t, h.ValidateConnect, "target_session_attrs holds for each host")
		require.Equal(t, cfg.ConnConfig.ConnectTimeout, h.ConnectTimeout)
	}
	require.Len(t, cfg.ConnConfig.Fallbacks, 5, "the config split is left as it was")
	require.False(t, strings.Contains(hosts[0].Host, ","))
}

// Statements cut by their deadline on a host that went silent (a frozen
// primary) leave their pool slots free within seconds: pgx's cancel request
// and close, which would wait 15 s for the silent host, are bounded, and
// the pool opens connections to the next host. (Unbounded, a pool whose
// every slot was in use waits the 15 s before it can dial at all.)
func TestAPoolWhoseHostWentSilentServesThroughTheNextWithinSeconds(t *testing.T) {
	t.Parallel()
	testdb.Pool(t)
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.New(t, u.Host)
	u.Host = proxy.Addr() + "," + u.Host
	cfg, err := pgnodes.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Resume)

	var wg sync.WaitGroup
	for range 2 { // every slot holds a connection through the first host
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := pool.Exec(ctx, "SELECT pg_sleep(1)")
			assert.Error(t, err, "the first host went silent during the statement")
		})
	}
	time.Sleep(300 * time.Millisecond)
	proxy.Stall()
	wg.Wait()

	// Less than the 15 s pgx would wait on each slot.
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	start := time.Now()
	_, err = pool.Exec(ctx, "SELECT 1")
	require.NoError(t, err, "a statement through the second host")
	t.Logf("served through the second host %s after the statements were cut", time.Since(start).Round(time.Millisecond))
}

// A statement waiting on a host that goes silent (a frozen primary) fails
// as soon as a new connection to that host gets no answer, not at its own
// deadline: the host's open connections are cut, and the pool serves
// through the next host. (Left alone, the statement would wait for its
// deadline, a minute here, as a batch waits for its commit timeout.)
func TestAStatementOnAHostThatWentSilentIsCutWhenANewConnectionGetsNoAnswer(t *testing.T) {
	t.Parallel()
	testdb.Pool(t)
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.New(t, u.Host)
	u.Host = proxy.Addr() + "," + u.Host
	cfg, err := pgnodes.ParseConfig(u.String())
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Resume)

	waiting, err := pool.Acquire(context.Background()) // through the first host
	require.NoError(t, err)
	defer waiting.Release()
	failed := make(chan time.Time, 1)
	go func() { // ends by the test's end: its statement is cut, or ends after a minute
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := waiting.Exec(ctx, "SELECT pg_sleep(50)")
		assert.Error(t, err, "the first host went silent during the statement")
		failed <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	proxy.Stall()
	stalled := time.Now()

	// A new connection tries the first host, gets no answer, and goes on
	// to the second.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = pool.Exec(ctx, "SELECT 1")
	require.NoError(t, err, "a statement through the second host")
	select {
	case at := <-failed:
		t.Logf("the waiting statement failed %s after the host went silent", at.Sub(stalled).Round(time.Millisecond))
		require.Less(t, at.Sub(stalled), 2*pgnodes.DefaultConnectTimeout)
	case <-time.After(20 * time.Second):
		t.Fatal("the statement on the silent host still waits")
	}
}
