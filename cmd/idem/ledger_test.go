package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

func runLedgerCmd(t *testing.T, tables idem.Tables, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append(args, "--pg-url", testdb.URL(), "--schema", tables.Schema)
	code := run(context.Background(), full, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestLedgerCommandsResolveAnUnknownEffectWithAudit(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	var e ledger.Entry
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		e, err = l.Record(ctx, tx, ledger.Effect{Type: "payment.capture", BusinessKey: "order-1", Request: []byte(`{"cents":100}`)})
		return err
	}))
	// A dispatcher lost track of the call: the effect is unknown.
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("ledger")+" SET status = 'unknown', attempt_count = 1 WHERE effect_id = $1", e.ID)
	require.NoError(t, err)

	out, stderr, code := runLedgerCmd(t, tables, "ledger", "list", "--status", "unknown")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, e.ID)
	require.Contains(t, out, "payment.capture")

	out, stderr, code = runLedgerCmd(t, tables, "ledger", "show", e.ID)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `{"cents":100}`)
	require.Contains(t, out, e.IdempotencyKey)

	_, stderr, code = runLedgerCmd(t, tables, "ledger", "resolve", e.ID, "--as", "succeeded")
	require.Equal(t, 2, code, "a reason is required")
	require.Contains(t, stderr, "--reason")

	out, stderr, code = runLedgerCmd(t, tables, "ledger", "resolve", e.ID, "--as", "succeeded", "--reason", "captured per provider dashboard", "--operator", "alice")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "succeeded")

	var operator, from, to, reason string
	require.NoError(t, pool.QueryRow(ctx, "SELECT operator, from_status, to_status, reason FROM "+tables.Table("ledger_audit")+" WHERE effect_id = $1", e.ID).
		Scan(&operator, &from, &to, &reason))
	require.Equal(t, []string{"alice", "unknown", "succeeded", "captured per provider dashboard"}, []string{operator, from, to, reason})

	out, stderr, code = runLedgerCmd(t, tables, "ledger", "show", e.ID)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "by alice: unknown -> succeeded")

	out, stderr, code = runLedgerCmd(t, tables, "ledger", "stats")
	require.Equal(t, 0, code, stderr)
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "succeeded") {
			require.Equal(t, []string{"succeeded", "1"}, strings.Fields(line))
		}
		if strings.HasPrefix(line, "unknown") {
			require.Equal(t, []string{"unknown", "0"}, strings.Fields(line))
		}
	}
}

func TestLedgerShowOfAnEffectRetentionRemovedPrintsItsTombstone(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	f.exec("INSERT INTO " + f.tables.Table("ledger_tombstones") + ` (effect_id, idempotency_key, status, settled_at)
		VALUES ('gone-1', 'key-1', 'succeeded', now() - interval '200 days')`)
	out, stderr, code := f.cmd("ledger", "show", "gone-1")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "succeeded (retention removed the effect; this is its tombstone)")
	require.Contains(t, out, "key-1")
	out, _, code = f.cmd("ledger", "show", "gone-1", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"tombstone": true`)

	_, stderr, code = f.cmd("ledger", "show", "never-recorded")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not found")
}
