package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// effects records n effects of type typ and puts them in status s; it
// returns their ids.
func (f *cliFixture) effects(typ string, s ledger.Status, n int) []string {
	f.t.Helper()
	ctx := context.Background()
	l, err := ledger.New(ledger.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(f.t, err)
	var ids []string
	require.NoError(f.t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for i := range n {
			e, err := l.Record(ctx, tx, ledger.Effect{Type: typ, BusinessKey: fmt.Sprintf("%s-%s-%d", typ, s, i),
				Consumer: "billing", Request: []byte(`{}`)})
			if err != nil {
				return err
			}
			ids = append(ids, e.ID)
		}
		return nil
	}))
	f.exec("UPDATE "+f.tables.Table("ledger")+" SET status = $2 WHERE effect_id = ANY($1)", ids, string(s))
	return ids
}

// ledgerAudits counts the ledger's audit rows of operator and reason.
func (f *cliFixture) ledgerAudits(operator, reason string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.tables.Table("ledger_audit")+
		" WHERE operator = $1 AND reason = $2", operator, reason).Scan(&n))
	return n
}

func TestLedgerResolveOfSeveralEffectsSaysWhatBecameOfEachAndExitsOneOnARefusal(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	unknown := f.effects("pay", ledger.StatusUnknown, 2)
	done := f.effects("pay", ledger.StatusSucceeded, 1)[0]

	out, stderr, code := f.cmd("ledger", "resolve", unknown[0], done, "never-recorded", unknown[1],
		"--as", "failed", "--reason", "INC-3: not in the provider's report", "--operator", "alice")
	require.Equal(t, 1, code, "a refusal exits 1")
	require.Equal(t, []string{
		"effect " + unknown[0] + " is now failed_terminal (audited as alice)",
		"effect " + done + " refused: ledger: effect cannot be resolved: " + done + " is succeeded",
		"effect never-recorded refused: ledger: effect never-recorded: ledger: effect not found",
		"effect " + unknown[1] + " is now failed_terminal (audited as alice)",
		"resolved 2 of 4 effects; 2 refused",
	}, strings.Split(strings.TrimSpace(out), "\n"))
	require.Contains(t, stderr, "2 of 4 effects refused")
	require.Equal(t, 2, f.ledgerAudits("alice", "INC-3: not in the provider's report"))

	// --json: an element per effect; with --status, an effect must still be in it.
	pending := f.effects("mail", ledger.StatusPending, 1)[0]
	more := f.effects("mail", ledger.StatusUnknown, 1)[0]
	out, stderr, code = f.cmd("ledger", "resolve", pending, more, "--status", "unknown", "--as", "retry", "--reason", "INC-4",
		"--operator", "bob", "--json")
	require.Equal(t, 1, code, stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, []map[string]any{
		{"effect_id": pending, "resolved": false, "from": "pending", "status": "pending",
			"error": "ledger: resolve " + pending + ": ledger: effect cannot be resolved: " + pending + " is pending now, no longer unknown"},
		{"effect_id": more, "resolved": true, "from": "unknown", "status": "pending", "error": nil},
	}, got)
	require.Equal(t, 1, f.ledgerAudits("bob", "INC-4"))
}

func TestLedgerResolveAllResolvesEveryEffectOfTheFilterAndNothingElse(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	pay := f.effects("pay", ledger.StatusUnknown, 130) // more than a page
	refund := f.effects("refund", ledger.StatusUnknown, 1)[0]
	pending := f.effects("pay", ledger.StatusPending, 1)[0]

	out, stderr, code := f.cmd("ledger", "resolve", "--status", "unknown", "--type", "pay", "--all",
		"--as", "succeeded", "--reason", "INC-5: the provider's report has them all", "--operator", "carol")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 131)
	for _, id := range pay {
		require.Contains(t, out, "effect "+id+" is now succeeded (audited as carol)\n")
	}
	require.Equal(t, "resolved 130 of 130 effects; 0 refused", lines[130])
	require.Equal(t, 130, f.ledgerAudits("carol", "INC-5: the provider's report has them all"))
	for id, want := range map[string]string{refund: "unknown", pending: "pending"} {
		out, _, code := f.cmd("ledger", "show", id, "--json")
		require.Equal(t, 0, code)
		require.Contains(t, out, `"status": "`+want+`"`, "%s is outside the filter", id)
	}

	out, stderr, code = f.cmd("ledger", "resolve", "--status", "unknown", "--all", "--as", "succeeded", "--reason", "again")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "effect "+refund+" is now succeeded")
	require.Contains(t, out, "resolved 1 of 1 effects; 0 refused")
}

func TestResolveRefusesAFilterWithoutAllOrAStatus(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"ledger", "resolve", "--status", "unknown", "--as", "failed", "--reason", "r"},    // a filter without --all
		{"ledger", "resolve", "--type", "pay", "--all", "--as", "failed", "--reason", "r"}, // --all without a status
		{"ledger", "resolve", "--all", "--as", "failed", "--reason", "r"},                  // --all alone
		{"ledger", "resolve", "e-1", "--status", "unknown", "--all", "--as", "failed", "--reason", "r"},
		{"ledger", "resolve", "e-1", "--type", "pay", "--as", "failed", "--reason", "r"},      // --type narrows --all only
		{"ledger", "resolve", "--status", "lost", "--all", "--as", "failed", "--reason", "r"}, // no such status
		{"http-keys", "resolve", "--state", "unknown", "--as", "retry", "--reason", "r"},
		{"http-keys", "resolve", "--operation", "o", "--all", "--as", "retry", "--reason", "r"},
		{"http-keys", "resolve", "k", "--tenant", "acme", "--as", "retry", "--reason", "r"},
		{"http-keys", "resolve", "--status", "gone", "--all", "--as", "retry", "--reason", "r"},
	} {
		_, stderr, code := idemCmd(append(args, "--pg-url", nowhere)...)
		require.Equal(t, 2, code, "%q: %s", args, stderr)
		require.NotEmpty(t, stderr, "%q", args)
	}
}

func TestHTTPKeysResolveOfSeveralKeysAndOfAFilter(t *testing.T) {
	t.Parallel()
	f := newHTTPKeysFixture(t)
	out, stderr, code := f.cmd("http-keys", "resolve", f.unknown, f.done, "--as", "completed", "--reason", "INC-8",
		"--operator", "bob")
	require.Equal(t, 1, code, "the completed key is refused")
	require.Equal(t, []string{
		"key " + f.unknown + " is now completed (audited as bob)",
		"key " + f.done + " refused: httpinbox: this key cannot be resolved so: it is completed, and completed can only become nothing: its response is stored",
		"resolved 1 of 2 keys; 1 refused",
	}, strings.Split(strings.TrimSpace(out), "\n"))
	require.Contains(t, stderr, "1 of 2 keys refused")

	// Two more unknown outcomes, of another operation; --all takes those
	// of its filter's state only (the completed ones stay).
	pool, _ := testdb.Schema(t) // a pool on the same database
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: f.tables, Logger: slog.New(slog.DiscardHandler),
		Tenant: func(*http.Request) string { return "acme" },
		Caller: func(*http.Request) string { return "carol" }})
	require.NoError(t, err)
	h := m.Handle(httpinbox.Route{Operation: "refunds.create"}, func(context.Context, pgx.Tx, *http.Request) (httpinbox.Response, error) {
		return httpinbox.Unknown(httpinbox.Problem(http.StatusGatewayTimeout, "PROVIDER_TIMEOUT", "no answer")), nil
	})
	for _, key := range []string{"r-1", "r-2"} {
		req := httptest.NewRequest(http.MethodPost, "/refunds", strings.NewReader(`{}`))
		req.Header.Set(httpinbox.HeaderKey, key)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	out, stderr, code = f.cmd("http-keys", "resolve", "--status", "unknown", "--all", "--operation", "refunds.create",
		"--as", "retry", "--reason", "INC-9: never refunded", "--operator", "dave", "--json")
	require.Equal(t, 0, code, stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, 2)
	for i, key := range []string{"r-1", "r-2"} {
		require.Equal(t, map[string]any{"key_id": httpinbox.KeyID("acme", "carol", "refunds.create", key), "resolved": true,
			"from": "unknown", "state": "started", "error": nil}, got[i])
	}
}

func TestLedgerListShowsTheBusinessAndIdempotencyKeysAndPages(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	second := f.effects("pay", ledger.StatusUnknown, 1)[0]
	out, stderr, code := f.cmd("ledger", "list", "--limit", "1")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^EFFECT_ID\s+TYPE\s+STATUS\s+BUSINESS_KEY\s+IDEMPOTENCY_KEY\s+ATTEMPTS\s+CREATED\s+LAST_ERROR$`, lines[0])
	require.Regexp(t, `^`+f.effectID+`\s+mail\s+pending\s+o-1\s+`+ledger.IdempotencyKey(f.effectID)+`\s+0\s`, lines[1])
	_, cursor, ok := strings.Cut(strings.TrimSpace(stderr), "add --after ")
	require.True(t, ok, "a full page says how to list the next: %s", stderr)
	cursor, _, _ = strings.Cut(cursor, " ")

	out, stderr, code = f.cmd("ledger", "list", "--limit", "1", "--after", cursor, "--json")
	require.Equal(t, 0, code, stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got, 1)
	require.Equal(t, second, got[0]["effect_id"])
	require.Equal(t, ledger.IdempotencyKey(second), got[0]["idempotency_key"])
	require.Equal(t, "pay-unknown-0", got[0]["business_key"])
}

func TestDeadLettersListGroupedByReasonAndByConsumer(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t) // one dead letter of billing: max_attempts
	for _, c := range []struct{ consumer, reason string }{
		{"billing", "max_attempts"}, {"billing", "payload_conflict"}, {"shipping", "max_attempts"},
	} {
		f.exec("INSERT INTO "+f.tables.Table("dead_letters")+` (consumer, message_id, payload_hash, reason)
			VALUES ($1, 'x', sha256('x'), $2)`, c.consumer, c.reason)
	}

	out, stderr, code := f.cmd("deadletters", "list", "--group-by", "reason")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^REASON\s+COUNT\s+OLDEST\s+NEWEST$`, lines[0])
	require.Regexp(t, `^max_attempts\s+3\s+\S+Z\s+\S+Z$`, lines[1], "largest first")
	require.Regexp(t, `^payload_conflict\s+1\s`, lines[2])

	out, stderr, code = f.cmd("deadletters", "list", "--group-by", "consumer,reason", "--count-cap", "1", "--json")
	require.Equal(t, 0, code, stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got, 3)
	require.Equal(t, "billing", got[0]["consumer"])
	require.Equal(t, "max_attempts", got[0]["reason"])
	require.Equal(t, 1.0, got[0]["count"])
	require.Equal(t, true, got[0]["capped"], "billing has two max_attempts, more than the cap")
	require.NotNil(t, got[0]["oldest"])

	out, stderr, code = f.cmd("deadletters", "list", "--group-by", "consumer,reason", "--limit", "1", "--count-cap", "1")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^billing\s+max_attempts\s+1\+\s`, out, "a capped count shows N+")
	require.Contains(t, stderr, "more groups follow")

	_, stderr, code = f.cmd("deadletters", "list", "--group-by", "message_id")
	require.Equal(t, 2, code, stderr)
	_, stderr, code = f.cmd("deadletters", "list", "--group-by", "reason", "--reason", "max_attempts")
	require.Equal(t, 2, code, stderr)
}
