package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// httpKeysFixture is a schema with two keys of tenant "acme": "k-unknown",
// whose handler could not prove its outcome, and "k-done", completed. Their
// caller is "alice" with a terminal escape sequence, as a hostile client
// might name itself where the scope comes from a header.
type httpKeysFixture struct {
	tables          idem.Tables
	unknown, done   string // key ids
	unknownResponse string
}

const hostileCaller = "alice\x1b[2J"

func newHTTPKeysFixture(t *testing.T) *httpKeysFixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	m, err := httpinbox.New(pool, httpinbox.Config{
		Tables: tables, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(*http.Request) string { return "acme" },
		Caller: func(*http.Request) string { return hostileCaller },
	})
	require.NoError(t, err)
	h := m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		if httpinbox.FromContext(ctx).Key() == "k-unknown" {
			return httpinbox.Unknown(httpinbox.Problem(http.StatusGatewayTimeout, "PROVIDER_TIMEOUT", "no answer")), nil
		}
		return httpinbox.JSON(http.StatusCreated, map[string]string{"id": "pay-1"})
	})
	f := &httpKeysFixture{tables: tables,
		unknown: httpinbox.KeyID("acme", hostileCaller, "payments.create", "k-unknown"),
		done:    httpinbox.KeyID("acme", hostileCaller, "payments.create", "k-done")}
	for _, key := range []string{"k-unknown", "k-done"} {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set(httpinbox.HeaderKey, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if key == "k-unknown" {
			f.unknownResponse = rec.Body.String()
		}
	}
	return f
}

func (f *httpKeysFixture) cmd(args ...string) (stdout, stderr string, code int) {
	return idemCmd(append(args, "--pg-url", testdb.URL(), "--schema", f.tables.Schema)...)
}

func TestHTTPKeysCommandsFindAndResolveAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	f := newHTTPKeysFixture(t)

	out, stderr, code := f.cmd("http-keys", "list", "--state", "unknown")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	require.Regexp(t, `^`+f.unknown+`\s+unknown\s+acme\s+alice\\x1b\[2J\s+payments\.create\s+k-unknown\s+504\s+1\s+\S+$`, lines[1])
	require.NotContains(t, out, "\x1b", "a caller's escape sequence never reaches the terminal")

	out, stderr, code = f.cmd("http-keys", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, f.done)

	out, stderr, code = f.cmd("http-keys", "show", f.unknown)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "PROVIDER_TIMEOUT")
	require.Contains(t, out, "header           Content-Type: application/problem+json")

	_, stderr, code = f.cmd("http-keys", "resolve", f.unknown, "--as", "completed")
	require.Equal(t, 2, code, "a reason is required")
	require.Contains(t, stderr, "--reason")
	_, stderr, code = f.cmd("http-keys", "resolve", f.unknown, "--as", "succeeded", "--reason", "x")
	require.Equal(t, 2, code, stderr)
	_, stderr, code = f.cmd("http-keys", "list", "--state", "done")
	require.Equal(t, 2, code, stderr)

	out, stderr, code = f.cmd("http-keys", "resolve", f.unknown, "--as", "completed",
		"--reason", "captured per provider dashboard", "--operator", "bob")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "key "+f.unknown+" is now completed (audited as bob)\n", out)

	out, stderr, code = f.cmd("http-keys", "show", f.unknown)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "by bob: unknown -> completed: captured per provider dashboard")

	_, stderr, code = f.cmd("http-keys", "resolve", f.unknown, "--as", "retry", "--reason", "no payment", "--operator", "carol")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "an operator resolved the key already: "+f.unknown+" by bob at ")
	require.Contains(t, stderr, `unknown -> completed: "captured per provider dashboard"`)

	_, stderr, code = f.cmd("http-keys", "resolve", f.done, "--as", "retry", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "cannot be resolved")
	_, stderr, code = f.cmd("http-keys", "show", strings.Repeat("0", 64))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such idempotency key")
}

func TestHTTPKeysJSONIsOneDocumentWithSnakeCaseKeys(t *testing.T) {
	t.Parallel()
	f := newHTTPKeysFixture(t)
	out, stderr, code := f.cmd("http-keys", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list, 2)
	for _, k := range []string{"key_id", "state", "tenant", "caller", "operation", "idempotency_key", "status_code",
		"resource_id", "attempts", "locked_until", "created_at", "completed_at", "expires_at", "forget_at"} {
		require.Contains(t, list[0], k)
	}
	require.Equal(t, hostileCaller, list[0]["caller"], "JSON carries the value exactly, escaped by JSON itself")

	out, stderr, code = f.cmd("http-keys", "show", f.unknown, "--json")
	require.Equal(t, 0, code, stderr)
	var one map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &one), out)
	for _, k := range []string{"key_id", "state", "fingerprint", "lock_owner", "headers", "body", "body_omitted", "history"} {
		require.Contains(t, one, k)
	}
	require.Equal(t, "unknown", one["state"])
	require.Equal(t, f.unknownResponse, one["body"])
	require.EqualValues(t, 504, one["status_code"])
	require.Equal(t, []any{}, one["history"])
}
