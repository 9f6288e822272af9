package main

import (
	"encoding/json"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// hostile is text a producer or a handler could put in any column: it
// clears the screen, turns it red, reverses what follows and forges a row.
const hostile = "\x1b[2J\x1b[31mevil\u202egpj.exe\n9\t2025-01-01T00:00:00Z\tfake\u009b"

// hostileShown is hostile as the commands print it.
const hostileShown = `\x1b[2J\x1b[31mevil\u202egpj.exe\x0a9\x092025-01-01T00:00:00Z\x09fake\u009b`

// newHostileFixture is newCLIFixture with hostile text in every text column
// the commands print.
func newHostileFixture(t *testing.T) *cliFixture {
	t.Helper()
	f := newCLIFixture(t)
	tb := f.tables
	f.exec("UPDATE "+tb.Table("inbox")+" SET consumer = $1, message_id = $1, business_key = $1, source = $1", hostile)
	f.exec("UPDATE "+tb.Table("ledger")+` SET effect_id = $1, effect_type = $1, consumer = $1, message_id = $1,
		business_key = $1, target = $1, idempotency_key = $1, last_error = $1, lock_owner = $1, request = $2`,
		hostile, []byte(`{"to":"`+hostile+`"}`))
	f.exec("INSERT INTO "+tb.Table("ledger_audit")+` (effect_id, operator, from_status, to_status, reason)
		VALUES ($1, $1, 'unknown', 'pending', $1)`, hostile)
	f.exec("UPDATE "+tb.Table("dead_letters")+` SET consumer = $1, message_id = $1, reason = $1, error = $1,
		source = $1`, hostile)
	f.exec("UPDATE "+tb.Table("replay_runs")+` SET run_id = $1, consumer = $1, stream = $1, from_position = $1,
		to_position = $1, operator = $1, reason = $1`, hostile)
	return f
}

// requireDisplayable fails unless s holds only printable runes and newlines.
func requireDisplayable(t *testing.T, s string, args []string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "%q: %q", args, s)
	for _, r := range s {
		require.True(t, r == '\n' || unicode.IsPrint(r), "%q printed %U: %q", args, r, s)
	}
}

func TestTextOutputEscapesWhatCouldSteerTheTerminal(t *testing.T) {
	t.Parallel()
	f := newHostileFixture(t)
	for _, c := range []struct {
		args  []string
		shown bool // stdout shows the hostile text, escaped
	}{
		{[]string{"inbox", "show", "--consumer", hostile, "--id", hostile}, true},
		{[]string{"inbox", "stats"}, true},
		{[]string{"ledger", "list"}, true},
		{[]string{"ledger", "show", hostile}, true},
		{[]string{"ledger", "stats"}, false},
		{[]string{"deadletters", "list"}, true},
		{[]string{"replay", "runs"}, true},
		{[]string{"ledger", "resolve", hostile, "--as", "failed", "--reason", "INC-7", "--operator", hostile}, true},
	} {
		out, stderr, code := f.cmd(c.args...)
		require.Equal(t, 0, code, "%q: %q", c.args, stderr)
		requireDisplayable(t, out, c.args)
		if c.shown {
			require.Contains(t, out, hostileShown, "%q", c.args)
		}
	}
	// Errors quote what they were given, escaped as well.
	for _, args := range [][]string{{"replay", "abandon", hostile}, {"ledger", "show", hostile + "x"},
		{"inbox", "show", "--consumer", "c", "--id", hostile}} {
		out, stderr, code := f.cmd(args...)
		require.Equal(t, 1, code, "%q: %q", args, stderr)
		requireDisplayable(t, out+stderr, args)
	}
}

func TestJSONOutputKeepsTheTextAsStored(t *testing.T) {
	t.Parallel()
	f := newHostileFixture(t)
	out, stderr, code := f.cmd("deadletters", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var rows []deadLetterJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1)
	require.Equal(t, hostile, rows[0].MessageID)
	require.Equal(t, hostile, rows[0].Error)
}
