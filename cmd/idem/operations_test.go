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

// operationsFixture is a schema with four operations of tenant "acme",
// accepted by route "reports.create" for the hostile caller: "op-unknown",
// which its worker could not finish, "op-running", "op-done", succeeded,
// and "op-follows", which follows the ledger effect "eff-1".
type operationsFixture struct {
	tables idem.Tables
}

func newOperationsFixture(t *testing.T) *operationsFixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	m, err := httpinbox.New(pool, httpinbox.Config{
		Tables: tables, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(*http.Request) string { return "acme" },
		Caller: func(*http.Request) string { return hostileCaller },
	})
	require.NoError(t, err)
	h := m.Handle(httpinbox.Route{Operation: "reports.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		id := httpinbox.FromContext(ctx).Key()
		a := httpinbox.Accepted{ID: id, Fields: map[string]string{"report": "2025-q1"}}
		if id == "op-follows" {
			a.Follows = "eff-1"
		}
		return m.Accept(ctx, tx, a)
	})
	for _, id := range []string{"op-unknown", "op-running", "op-done", "op-follows"} {
		req := httptest.NewRequest(http.MethodPost, "/reports", nil)
		req.Header.Set(httpinbox.HeaderKey, id)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	}
	ops, err := httpinbox.NewOperations(pool, tables)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, id := range []string{"op-unknown", "op-running"} {
			if err := ops.Start(ctx, tx, id); err != nil {
				return err
			}
		}
		if err := ops.Finish(ctx, tx, "op-unknown", httpinbox.OperationUnknown, map[string]string{"error": "renderer timed out"}); err != nil {
			return err
		}
		return ops.Finish(ctx, tx, "op-done", httpinbox.OperationSucceeded, map[string]string{"url": "/r.pdf"})
	}))
	return &operationsFixture{tables: tables}
}

func (f *operationsFixture) cmd(args ...string) (stdout, stderr string, code int) {
	return idemCmd(append(args, "--pg-url", testdb.URL(), "--schema", f.tables.Schema)...)
}

func TestOperationsCommandsFindAndResolveAnUnknownOperation(t *testing.T) {
	t.Parallel()
	f := newOperationsFixture(t)

	out, stderr, code := f.cmd("operations", "list", "--state", "unknown")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	require.Regexp(t, `^OPERATION_ID\s+STATE\s+TENANT\s+CALLER\s+KIND\s+FOLLOWS\s+CREATED\s+UPDATED$`, lines[0])
	require.Regexp(t, `^op-unknown\s+unknown\s+acme\s+alice\\x1b\[2J\s+reports\.create\s+-\s+\S+\s+\S+$`, lines[1])
	require.NotContains(t, out, "\x1b", "a caller's escape sequence never reaches the terminal")

	out, stderr, code = f.cmd("operations", "list")
	require.Equal(t, 0, code, stderr)
	for _, id := range []string{"op-unknown", "op-running", "op-done", "op-follows"} {
		require.Contains(t, out, id)
	}
	require.Regexp(t, `(?m)^op-follows\s+accepted\s+.*\s+eff-1\s+`, out)
	out, stderr, code = f.cmd("operations", "list", "--kind", "payments.create")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, strings.Count(out, "\n"), "only the header: %s", out)

	out, stderr, code = f.cmd("operations", "show", "op-unknown")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^result\s+\{"error":"renderer timed out"\}$`, out)
	require.Regexp(t, `(?m)^fields\s+\{"report":"2025-q1"\}$`, out)
	require.Regexp(t, `(?m)^location\s+/operations/op-unknown$`, out)

	for _, bad := range [][]string{
		{"resolve", "op-unknown", "--as", "succeeded"},                                   // no reason
		{"resolve", "op-unknown", "--as", "succeeded", "--reason", " "},                  // blank reason
		{"resolve", "op-unknown", "--as", "retry", "--reason", "x"},                      // not succeeded or failed
		{"resolve", "op-unknown", "--as", "unknown", "--reason", "x"},                    // not final
		{"resolve", "op-unknown", "--as", "succeeded", "--reason", "x", "--result", "{"}, // not JSON
		{"resolve", "--as", "failed", "--reason", "x"},                                   // no id
		{"list", "--state", "done"}, {"list", "--limit", "0"}, {"list", "--limit", "-1"},
		{"show"}, {"show", "op-1", "op-2"}, {"nope"}, {},
	} {
		out, stderr, code := f.cmd(append([]string{"operations"}, bad...)...)
		require.Equal(t, 2, code, "%q: %s", bad, stderr)
		require.Empty(t, out, "%q", bad)
		require.Contains(t, stderr, "idem operations: usage: ", "%q", bad)
	}

	out, stderr, code = f.cmd("operations", "resolve", "op-unknown", "--as", "succeeded",
		"--reason", "report found in the bucket", "--result", `{"url": "/r2.pdf"}`, "--operator", "bob")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "operation op-unknown is now succeeded (audited as bob)\n", out)

	out, stderr, code = f.cmd("operations", "show", "op-unknown")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "by bob: unknown -> succeeded: report found in the bucket")
	require.Regexp(t, `(?m)^result\s+\{"url":"/r2.pdf"\}$`, out)

	// A second operator learns who decided, and when.
	_, stderr, code = f.cmd("operations", "resolve", "op-unknown", "--as", "failed", "--reason", "never rendered", "--operator", "carol")
	require.Equal(t, 1, code)
	require.Regexp(t, `an operator resolved the operation already: op-unknown by bob at \d{4}-\d\d-\d\dT[0-9:]+Z, unknown -> succeeded: "report found in the bucket"`, stderr)

	// A running operation whose worker is gone fails with the default result.
	out, stderr, code = f.cmd("operations", "resolve", "op-running", "--as", "failed", "--reason", "worker host gone", "--operator", "bob")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "operation op-running is now failed (audited as bob)\n", out)
	out, stderr, code = f.cmd("operations", "show", "op-running")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "OPERATION_FAILED")

	_, stderr, code = f.cmd("operations", "resolve", "op-done", "--as", "failed", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "it is succeeded, and a finished operation never changes")
	_, stderr, code = f.cmd("operations", "resolve", "op-follows", "--as", "failed", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "resolve effect eff-1 instead (idem ledger resolve eff-1)")
	_, stderr, code = f.cmd("operations", "show", "op-nope")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such operation")
	_, stderr, code = f.cmd("operations", "resolve", "op-nope", "--as", "failed", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such operation")
	_, stderr, code = f.cmd("operations", "show", "op\x00\xff")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such operation")
}

func TestOperationsJSONIsOneDocumentWithSnakeCaseKeys(t *testing.T) {
	t.Parallel()
	f := newOperationsFixture(t)
	out, stderr, code := f.cmd("operations", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list, 4)
	for _, k := range []string{"operation_id", "state", "kind", "tenant", "caller", "follows", "location",
		"created_at", "updated_at", "finished_at", "expires_at"} {
		require.Contains(t, list[0], k)
	}
	require.Equal(t, hostileCaller, list[0]["caller"], "JSON carries the value exactly, escaped by JSON itself")
	byID := map[string]map[string]any{}
	for _, op := range list {
		byID[op["operation_id"].(string)] = op
	}
	require.Nil(t, byID["op-unknown"]["follows"])
	require.Equal(t, "eff-1", byID["op-follows"]["follows"])
	require.Nil(t, byID["op-unknown"]["finished_at"])
	require.NotNil(t, byID["op-done"]["finished_at"])

	out, stderr, code = f.cmd("operations", "show", "op-unknown", "--json")
	require.Equal(t, 0, code, stderr)
	var one map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &one), out)
	for _, k := range []string{"operation_id", "state", "fields", "result", "history"} {
		require.Contains(t, one, k)
	}
	require.Equal(t, "unknown", one["state"])
	require.Equal(t, map[string]any{"report": "2025-q1"}, one["fields"], "fields and result are JSON, not strings")
	require.Equal(t, map[string]any{"error": "renderer timed out"}, one["result"])
	require.Equal(t, []any{}, one["history"])

	out, stderr, code = f.cmd("operations", "show", "op-running", "--json")
	require.Equal(t, 0, code, stderr)
	one = nil
	require.NoError(t, json.Unmarshal([]byte(out), &one), out)
	require.Contains(t, one, "result")
	require.Nil(t, one["result"])
}
