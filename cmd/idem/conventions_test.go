package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// idemCmd runs `idem ARGS` and returns its output and exit code.
func idemCmd(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestHelpExitsZeroOnEveryCommandAndSubcommand(t *testing.T) {
	t.Parallel()
	cases := [][]string{{"--help"}, {"-h"}, {"help"}}
	for name, c := range commands {
		cases = append(cases, []string{name, "-h"}, []string{name, "--help"}, []string{"help", name})
		for _, sub := range c.subcommands {
			cases = append(cases, []string{name, sub, "-h"}, []string{name, sub, "--help"})
		}
	}
	for _, args := range cases {
		// No database is reachable there: help must not need one.
		out, stderr, code := idemCmd(append(args, "--pg-url", "postgres://nobody@127.0.0.1:1/none")...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		require.NotEmpty(t, out, "%v prints its help on stdout", args)
		require.Contains(t, strings.ToLower(out), "usage", "%v", args)
	}
}

// nowhere is a database that refuses at once: a command that gets past
// its usage checks fails there, with exit code 1.
const nowhere = "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"

// everyCommand lists each command line that runs something: a command
// without subcommands, or a command and one of its subcommands.
func everyCommand() [][]string {
	var out [][]string
	for name, c := range commands {
		if len(c.subcommands) == 0 {
			out = append(out, []string{name})
		}
		for _, sub := range c.subcommands {
			out = append(out, []string{name, sub})
		}
	}
	return out
}

func TestBadUsageExitsTwoOnEveryCommand(t *testing.T) {
	t.Parallel()
	for _, cmd := range everyCommand() {
		for _, bad := range [][]string{
			{"--no-such-flag"},
			{"--no-such-flag=1"},
			{"--schema"}, // no value
			{"--prefix", strings.Repeat("p", 64)},
			{"--schema", "a\x00b"},
			{"one", "two", "three", "four"}, // more arguments than any command takes
		} {
			args := append(slices.Clone(cmd), "--pg-url", nowhere)
			args = append(args, bad...)
			out, stderr, code := idemCmd(args...)
			require.Equal(t, 2, code, "%q: %s", args, stderr)
			require.Empty(t, out, "%q", args)
			require.Contains(t, stderr, "idem "+cmd[0]+": usage: ", "%q", args)
		}
	}
}

func TestBadUsageExitsTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{}, {"nope"}, {"help", "nope"}, {"inbox"}, {"inbox", "nope"}, {"ledger"}, {"ledger", "-x"}, {"deadletters"},
		{"replay"}, {"replay", "nope"},
		{"inbox", "show", "--consumer", "c"},
		{"inbox", "cleanup"}, {"inbox", "cleanup", "--older-than", "-1h"}, {"inbox", "cleanup", "--older-than", "3"},
		{"inbox", "cleanup", "--older-than", "0"}, {"inbox", "cleanup", "--older-than", "720h", "--chunk-size", "0"},
		{"ledger", "list", "--limit", "-1"}, {"ledger", "list", "--limit", "0"}, {"ledger", "list", "--limit", "ten"},
		{"ledger", "list", "--status", "lost"},
		{"ledger", "show"}, {"ledger", "show", "e-1", "e-2"},
		{"ledger", "resolve", "--as", "failed", "--reason", "r"}, {"ledger", "resolve", "e-1", "--as", "maybe", "--reason", "r"},
		{"ledger", "resolve", "e-1", "--as", "failed"}, {"ledger", "resolve", "e-1", "--as", "failed", "--reason", " "},
		{"deadletters", "list", "--limit", "-1"}, {"deadletters", "list", "--limit", "1.5"},
		{"deadletters", "redrive"}, {"deadletters", "redrive", "--queue", "q", "--limit", "-1"},
		{"replay", "runs", "--limit", "-1"}, {"replay", "abandon"}, {"replay", "abandon", "r-1", "r-2"},
		{"cleanup"}, {"cleanup", "--older-than", "-720h"}, {"cleanup", "--older-than", "720h", "--floor", "-1h"},
		{"cleanup", "--older-than", "720h", "--chunk-size", "-5"},
	} {
		_, stderr, code := idemCmd(append(args, "--pg-url", nowhere)...)
		require.Equal(t, 2, code, "%q: %s", args, stderr)
		require.NotEmpty(t, stderr, "%q", args)
	}
}

func TestFlagsGoBeforeOrAfterTheArguments(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	db := []string{"--pg-url", testdb.URL(), "--schema", f.tables.Schema}
	for _, c := range []struct {
		args []string
		code int
		out  string // in stdout (code 0) or stderr
	}{
		{append([]string{"ledger", "show", f.effectID, "--json"}, db...), 0, `"effect_id": "` + f.effectID},
		{append(append([]string{"ledger", "show", "--json"}, db...), f.effectID), 0, `"effect_id": "` + f.effectID},
		{append([]string{"ledger", "show", "--json", f.effectID, "--schema", f.tables.Schema}, db[:2]...), 0, `"effect_id"`},
		{append([]string{"ledger", "show", "--schema=" + f.tables.Schema, f.effectID}, db[:2]...), 0, "idempotency_key"},
		{append(append([]string{"ledger", "show"}, db...), "--", "--json"), 1, "--json"}, // an id after "--"
		{append([]string{"replay", "abandon", "r-1"}, db...), 1, "run r-1 is not an online rebuild"},
		{append(append([]string{"replay", "abandon"}, db...), "r-1"), 1, "run r-1 is not an online rebuild"},
		{append([]string{"ledger", "resolve", f.effectID, "--as", "failed", "--reason", "INC-9", "--operator", "bob"}, db...),
			0, "effect " + f.effectID + " is now failed_terminal (audited as bob)"},
	} {
		out, stderr, code := idemCmd(c.args...)
		require.Equal(t, c.code, code, "%q: %s", c.args, stderr)
		if c.code == 0 {
			require.Contains(t, out, c.out, "%q", c.args)
		} else {
			require.Contains(t, stderr, c.out, "%q", c.args)
		}
	}
}

func TestHelpNeverPrintsTheDatabasePassword(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, pgEnv: "postgres://root:s3cr3t-pa55@db/x"}
	require.ErrorIs(t, runInbox(context.Background(), e, []string{"stats", "--help"}), flag.ErrHelp)
	require.NotContains(t, out.String()+errOut.String(), "s3cr3t-pa55")
}

func TestMissingTablesNameTheMigrateCommand(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	empty := testdb.Name(t, "empty")
	_, err := pool.Exec(context.Background(), "CREATE SCHEMA "+idem.Tables{Schema: empty}.QuotedSchema())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+idem.Tables{Schema: empty}.QuotedSchema()+" CASCADE")
	})
	for _, schema := range []string{empty, testdb.Name(t, "absent")} {
		for _, args := range [][]string{
			{"inbox", "stats"}, {"inbox", "show", "--consumer", "c", "--id", "m"}, {"ledger", "list"}, {"ledger", "stats"},
			{"ledger", "show", "e-1"}, {"deadletters", "list"}, {"replay", "runs"}, {"cleanup", "--older-than", "720h"},
			{"inbox", "cleanup", "--older-than", "720h"},
		} {
			out, stderr, code := idemCmd(append(args, "--pg-url", testdb.URL(), "--schema", schema)...)
			require.Equal(t, 1, code, "%v in %s: %s", args, schema, stderr)
			require.Empty(t, out, "%v", args)
			require.Contains(t, stderr, "idem migrate --schema "+schema, "%v", args)
		}
	}
	_, stderr, _ := idemCmd("ledger", "list", "--pg-url", testdb.URL(), "--schema", empty, "--prefix", "app_")
	require.Contains(t, stderr, "idem migrate --schema "+empty+" --prefix app_")
}

// Not parallel: it sets the process environment.
func TestConnectionSettingsComeFromTheEnvironmentWithoutABuiltInDefault(t *testing.T) {
	_, tables := testdb.Schema(t)
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	pw, _ := u.User.Password()
	t.Setenv("IDEM_PG_URL", "")
	t.Setenv("PGHOST", u.Hostname())
	t.Setenv("PGPORT", u.Port())
	t.Setenv("PGUSER", u.User.Username())
	t.Setenv("PGPASSWORD", pw)
	t.Setenv("PGDATABASE", strings.TrimPrefix(u.Path, "/"))
	t.Setenv("PGSSLMODE", u.Query().Get("sslmode"))
	_, stderr, code := idemCmd("inbox", "stats", "--schema", tables.Schema)
	require.Equal(t, 0, code, "the PG* environment: %s", stderr)

	// IDEM_PG_URL wins over the PG* environment.
	t.Setenv("IDEM_PG_URL", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	_, _, code = idemCmd("inbox", "stats", "--schema", tables.Schema)
	require.Equal(t, 1, code)

	// Nothing set: no built-in test database, libpq's defaults.
	t.Setenv("IDEM_PG_URL", "")
	t.Setenv("PGPORT", "1")
	_, stderr, code = idemCmd("inbox", "stats", "--schema", tables.Schema)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "connect")
}

func TestJSONOutputIsOneDocumentWithSnakeCaseKeys(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	for _, c := range []struct {
		args []string
		keys []string // of the (first) object
	}{
		{[]string{"inbox", "show", "--consumer", "billing", "--id", "m-1"}, []string{"consumer", "message_id", "payload_hash",
			"business_key", "source", "stream_offset", "received_at"}},
		{[]string{"inbox", "stats"}, []string{"consumer", "rows", "oldest", "newest"}},
		{[]string{"ledger", "list"}, []string{"effect_id", "effect_type", "status", "consumer", "message_id", "business_key",
			"target", "attempt_count", "last_error", "created_at", "completed_at"}},
		{[]string{"ledger", "show", f.effectID}, []string{"effect_id", "status", "idempotency_key", "request", "request_hash",
			"response", "history", "next_attempt_at", "locked_until"}},
		{[]string{"ledger", "stats"}, []string{"counts", "oldest_due_seconds"}},
		{[]string{"deadletters", "list"}, []string{"id", "consumer", "message_id", "payload_hash", "stored_hash", "reason",
			"error", "attempts", "has_payload", "dead_lettered_at", "redriven_at", "redriven_by"}},
		{[]string{"replay", "runs"}, []string{"run_id", "mode", "consumer", "stream", "from", "to", "end_offset",
			"handoff_offset", "finished", "abandoned", "started_at", "finished_at", "audited", "dead_lettered", "operator", "reason"}},
	} {
		out, stderr, code := f.cmd(append(c.args, "--json")...)
		require.Equal(t, 0, code, "%v: %s", c.args, stderr)
		var doc any
		require.NoError(t, json.Unmarshal([]byte(out), &doc), "%v: %s", c.args, out)
		obj, ok := doc.(map[string]any)
		if list, isList := doc.([]any); isList {
			require.NotEmpty(t, list, "%v", c.args)
			obj, ok = list[0].(map[string]any)
		}
		require.True(t, ok, "%v: %s", c.args, out)
		for _, k := range c.keys {
			require.Contains(t, obj, k, "%v: %s", c.args, out)
		}
	}
}

func TestReplayRunsListsRunsWithTheirAuditCounts(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	out, stderr, code := f.cmd("replay", "runs")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	require.Regexp(t, `^r-1\s+repair\s+billing\s+orders\s+first\.\.tail \(end 9\)\s+finished\s+\S+\s+\S+\s+1\s+0\s+alice\s+INC-1$`, lines[1])
}
