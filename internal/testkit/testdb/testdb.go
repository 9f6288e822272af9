// Package testdb gives idem's own tests a real PostgreSQL: one pool per test
// binary and a fresh, migrated schema per test, dropped when the test ends.
//
// When the database is unreachable the test is skipped, except under CI=true,
// where it fails: CI must never pass by skipping the tests that matter.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/migrate"
)

// DefaultURL is used when IDEM_PG_URL is not set.
const DefaultURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// URL returns IDEM_PG_URL or DefaultURL.
func URL() string {
	if u := os.Getenv("IDEM_PG_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	once    sync.Once
	shared  *pgxpool.Pool
	openErr error
)

// Pool returns the pool shared by every test in this binary, or ends the test
// (skip, or fail under CI=true) when PostgreSQL cannot be reached.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(URL())
		if err != nil {
			openErr = err
			return
		}
		cfg.MaxConns = 32
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = p.Ping(ctx)
		}
		if err != nil {
			openErr = err
			return
		}
		shared = p
	})
	if openErr != nil {
		Unavailable(tb, "PostgreSQL", openErr)
	}
	return shared
}

// Unavailable ends the test because service is unreachable: a failure under
// CI=true, a skip otherwise.
func Unavailable(tb testing.TB, service string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required under CI=true and is unreachable: %v (run scripts/services.sh)", service, err)
	}
	tb.Skipf("%s unreachable, skipping (set CI=true to fail instead): %v", service, err)
}

// Schema creates a fresh schema named after the test, applies every idem
// migration to it and drops it when the test ends. It returns the shared pool
// and the tables to use.
func Schema(tb testing.TB) (*pgxpool.Pool, idem.Tables) {
	tb.Helper()
	pool := Pool(tb)
	tables := idem.Tables{Schema: Name(tb, "t")}
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		tb.Fatalf("testdb: migrate %s: %v", tables.Schema, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE"); err != nil {
			tb.Logf("testdb: drop schema %s: %v", tables.Schema, err)
		}
	})
	return pool, tables
}

// WithExecMode returns a pool like pool whose connections use the pgx query
// exec mode mode (exec and simple_protocol are PgBouncer's), closed when the
// test ends.
func WithExecMode(tb testing.TB, pool *pgxpool.Pool, mode pgx.QueryExecMode) *pgxpool.Pool {
	tb.Helper()
	cfg := pool.Config()
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: pool in mode %s: %v", mode, err)
	}
	tb.Cleanup(p.Close)
	return p
}

var unsafe = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a name unique to this test run: prefix, a readable part of the
// test's name and random hex. It is safe as a schema, queue or stream name.
func Name(tb testing.TB, prefix string) string {
	tb.Helper()
	base := unsafe.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(base) > 30 {
		base = base[len(base)-30:]
	}
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("testdb: random name: %v", err)
	}
	return prefix + "_" + strings.Trim(base, "_") + "_" + hex.EncodeToString(b[:])
}

// Proxied returns a pool of its own that reaches the test database through
// a fault proxy, and the proxy: a test refuses, severs or stalls the
// database for that pool only (see faultproxy.Proxy). The pool closes when
// the test ends, after the proxy resumed.
func Proxied(tb testing.TB) (*pgxpool.Pool, *faultproxy.Proxy) {
	tb.Helper()
	Pool(tb) // skip or fail like every database test when there is none
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	proxy := faultproxy.New(tb, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: proxied pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	tb.Cleanup(proxy.Resume) // runs first: the pool closes its connections through a passing proxy
	return pool, proxy
}

// URLAfterSilentHost returns the test database's URL with a host listed
// before it that accepts TCP connections and never answers (a stalled
// fault proxy): the first host of a multi-host URL gone silent, a frozen
// primary. The URL sets no connect_timeout. The host stays silent until
// the test ends.
func URLAfterSilentHost(tb testing.TB) string {
	tb.Helper()
	Pool(tb) // skip or fail like every database test when there is none
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	silent := faultproxy.New(tb, u.Host)
	silent.Stall()
	u.Host = silent.Addr() + "," + u.Host
	q := u.Query()
	q.Del("connect_timeout")
	u.RawQuery = q.Encode()
	return u.String()
}
