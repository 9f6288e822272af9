package pgnodes_test

import (
	"context"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/pgnodes"
)

// Every TCP connection of a ParseConfig pool sends keepalives and abandons
// unacknowledged data (TCP_USER_TIMEOUT), so a connection to a machine
// that vanished fails within seconds even under a call with no deadline.
func TestConnectionsSendKeepalivesAndHaveAUserTimeout(t *testing.T) {
	t.Parallel()
	testdb.Pool(t)
	cfg, err := pgnodes.ParseConfig(testdb.URL())
	require.NoError(t, err)
	pool, err := pgnodes.New(context.Background(), testdb.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	nc := conn.Conn().PgConn().Conn()
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = u.NetConn()
	}
	tcp, ok := nc.(*net.TCPConn)
	if !ok {
		t.Fatalf("the test database is not reached over TCP (%s): set IDEM_PG_URL to a TCP host", cfg.ConnConfig.Host)
	}
	raw, err := tcp.SyscallConn()
	require.NoError(t, err)
	opts := map[string]int{}
	require.NoError(t, raw.Control(func(fd uintptr) {
		for name, o := range map[string]struct{ level, opt int }{
			"SO_KEEPALIVE":     {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"TCP_KEEPIDLE":     {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			"TCP_KEEPINTVL":    {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"TCP_KEEPCNT":      {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
			"TCP_USER_TIMEOUT": {syscall.IPPROTO_TCP, 0x12},
		} {
			v, err := syscall.GetsockoptInt(int(fd), o.level, o.opt)
			require.NoError(t, err, name)
			opts[name] = v
		}
	}))
	require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 4, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3,
		"TCP_USER_TIMEOUT": 10000}, opts)
}
