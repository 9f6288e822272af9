package pgnodes

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults that ParseConfig sets where the URL sets none.
const (
	// DefaultConnectTimeout bounds one host's connection attempt: TCP, TLS,
	// authentication and the target_session_attrs check.
	DefaultConnectTimeout = 3 * time.Second
	// DefaultPingTimeout bounds the ping of a pooled connection that was
	// idle before it is handed out.
	DefaultPingTimeout = 2 * time.Second
)

// TCP settings of every connection ParseConfig's pools dial.
const (
	keepaliveIdle     = 4 * time.Second
	keepaliveInterval = 2 * time.Second
	keepaliveCount    = 3
	// userTimeout is TCP_USER_TIMEOUT (Linux): how long sent data may stay
	// unacknowledged before the kernel drops the connection; it also ends
	// a connection whose keepalives go unanswered.
	userTimeout = keepaliveIdle + keepaliveCount*keepaliveInterval
)

// ParseConfig parses a connection string (a URL or key=value pairs, which
// may list several hosts; "" reads the PG* environment as libpq does) like
// pgxpool.ParseConfig, and sets what a host that stops answering needs
// where the string sets none: a connect timeout per host
// (DefaultConnectTimeout), TCP keepalives and a TCP user timeout on every
// connection, and a timeout on the ping of an idle pooled connection
// (DefaultPingTimeout). Its errors never quote a password.
func ParseConfig(connString string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("pgnodes: parse the connection string: %w", err) // pgx redacts the password
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	cfg.ConnConfig.DialFunc = dialer(cfg.ConnConfig.ConnectTimeout)
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = DefaultPingTimeout
	}
	return cfg, nil
}

// New creates a pool from connString configured by ParseConfig. Like
// pgxpool.New, it does not connect: the first acquire does.
func New(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgnodes: create the pool: %w", err)
	}
	return pool, nil
}

// Hosts returns one config per host of config (config.Host and its
// Fallbacks, in order), each a copy of config that reaches that host
// alone. The fallbacks pgx adds for one host (with sslmode=prefer: TLS,
// then plain) stay with their host.
func Hosts(config *pgx.ConnConfig) []*pgx.ConnConfig {
	all := append([]*pgconn.FallbackConfig{{Host: config.Host, Port: config.Port, TLSConfig: config.TLSConfig}},
		config.Fallbacks...)
	var out []*pgx.ConnConfig
	var last string
	for _, fb := range all {
		addr := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))
		if len(out) > 0 && addr == last {
			c := out[len(out)-1]
			c.Fallbacks = append(c.Fallbacks, fb)
			continue
		}
		c := config.Copy()
		c.Host, c.Port, c.TLSConfig, c.Fallbacks = fb.Host, fb.Port, fb.TLSConfig, nil
		out = append(out, c)
		last = addr
	}
	return out
}
