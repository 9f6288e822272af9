package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestDurationsTakeDays(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"30d": 720 * time.Hour, "7d12h": 180 * time.Hour, "0d": 0, "1d30m": 24*time.Hour + 30*time.Minute,
		"90s": 90 * time.Second, "168h": 168 * time.Hour,
	} {
		got, err := parseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"d", "1.5d", "-1d", "1d-1h", "1d+1h", "30 d", "30days", "1dd", "99999999d", "",
		"106752d", "213504d", "106751d23h47m16.854775808s"} { // beyond time.Duration, never wrapped around
		_, err := parseDuration(in)
		require.Error(t, err, in)
	}
}

func TestABadFlagIsReportedOnceWithAPointerToHelp(t *testing.T) {
	t.Parallel()
	out, stderr, code := idemCmd("cleanup", "--older-than", "30x")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(stderr, `invalid value "30x"`), stderr)
	require.Contains(t, stderr, "see 'idem cleanup --help'")
}

func TestSubcommandHelpShowsItsArgumentsAndNoComputedDefault(t *testing.T) {
	t.Parallel()
	for args, synopsis := range map[string]string{
		"ledger resolve":      "usage: idem ledger resolve ID... --as",
		"http-keys resolve":   "usage: idem http-keys resolve KEY_ID... --as",
		"operations show":     "usage: idem operations show OPERATION_ID",
		"deadletters redrive": "usage: idem deadletters redrive --queue Q",
		"replay abandon":      "usage: idem replay abandon RUN_ID",
	} {
		out, _, code := idemCmd(append(strings.Fields(args), "--help")...)
		require.Equal(t, 0, code, args)
		require.Contains(t, out, synopsis, args)
		if strings.HasSuffix(args, "resolve") || strings.HasSuffix(args, "redrive") {
			require.Contains(t, out, "(default: the OS user)\n", args)
		}
	}
}

func TestConnectionErrorsNameHostPortAndDatabase(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	_, stderr, code := idemCmd("inbox", "stats", "--pg-url", "postgres://app:pw@"+addr+"/shopdb?connect_timeout=2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `database "shopdb" on `+addr+" (from --pg-url)")
	require.NotContains(t, stderr, "pw@")
}

func TestMissingTablesNameTheDatabaseIdemLookedIn(t *testing.T) {
	t.Parallel()
	schema := testdb.Name(t, "absent")
	_, stderr, code := idemCmd("ledger", "list", "--pg-url", testdb.URL(), "--schema", schema)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `of database "test" on 127.0.0.1:5432 (from --pg-url)`)
	require.Contains(t, stderr, "point idem at it")
}

// Not parallel: it sets the process environment.
func TestSchemaAndPrefixComeFromTheEnvironment(t *testing.T) {
	pool, tables := testdb.Schema(t)
	t.Setenv("IDEM_SCHEMA", tables.Schema)
	_, stderr, code := idemCmd("inbox", "stats", "--pg-url", testdb.URL())
	require.Equal(t, 0, code, stderr)

	// A flag wins over the environment.
	_, stderr, code = idemCmd("inbox", "stats", "--pg-url", testdb.URL(), "--schema", testdb.Name(t, "absent"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "absent")

	t.Setenv("IDEM_PREFIX", "app_")
	_, stderr, code = idemCmd("inbox", "stats", "--pg-url", testdb.URL())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--prefix app_", stderr)
	require.NoError(t, pool.Ping(context.Background()))
}
