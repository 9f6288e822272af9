package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCleanupPrintsACountPerTableAndRefusesBelowTheFloor(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	f.exec("UPDATE " + f.tables.Table("inbox") + " SET received_at = now() - interval '40 days'")
	f.exec("UPDATE " + f.tables.Table("dead_letters") + " SET dead_lettered_at = now() - interval '40 days'")

	out, stderr, code := f.cmd("cleanup", "--older-than", "24h")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, stderr, "refused, nothing deleted")
	require.Contains(t, stderr, "below the retention floor 168h")
	require.Contains(t, stderr, "--floor")
	_, _, code = f.cmd("inbox", "stats")
	require.Equal(t, 0, code)

	out, stderr, code = f.cmd("cleanup", "--older-than", "720h", "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Cutoff string `json:"cutoff"`
		Tables []struct {
			Table   string  `json:"table"`
			Cutoff  *string `json:"cutoff"`
			Deleted int64   `json:"deleted"`
		} `json:"tables"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.NotEmpty(t, res.Cutoff)
	deleted := map[string]int64{}
	kept := map[string]bool{}
	for _, c := range res.Tables {
		deleted[c.Table] = c.Deleted
		kept[c.Table] = c.Cutoff == nil
	}
	require.Equal(t, map[string]int64{"inbox": 1, "ledger": 0, "ledger_audit": 0, "ledger_tombstones": 0, "dead_letters": 1,
		"replay_runs": 0, "replay_audit": 0, "checkpoints": 0, "attempts": 0, "http_keys": 0}, deleted)
	require.Equal(t, map[string]bool{"inbox": false, "ledger": false, "ledger_audit": false, "ledger_tombstones": true,
		"dead_letters": false, "replay_runs": false, "replay_audit": false, "checkpoints": false, "attempts": false,
		"http_keys": true}, kept, "a cutoff per table, none for kept tombstones and expiring HTTP keys")

	f.exec("UPDATE " + f.tables.Table("replay_runs") + " SET finished_at = now() - interval '2 hours'")
	out, stderr, code = f.cmd("cleanup", "--older-than", "1h", "--floor", "1h")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 11, out)
	require.Regexp(t, `^TABLE\s+DELETED\s+KEEPS$`, lines[0])
	require.Regexp(t, `^idem_inbox\s+0\s+since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, lines[1])
	require.Regexp(t, `^idem_replay_runs\s+1\s+since `, lines[6], "the run finished two hours ago")
	require.Regexp(t, `^idem_replay_audit\s+1\s+since `, lines[7])
}

// Settled effects keep their own retention and leave tombstones, which
// are kept unless told otherwise; the command shows each table's cutoff.
func TestCleanupKeepsSettledEffectsOnTheirOwnCutoffAndShowsIt(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	f.exec("UPDATE " + f.tables.Table("inbox") + " SET received_at = now() - interval '40 days'")
	f.exec("UPDATE " + f.tables.Table("ledger") + " SET status = 'succeeded', completed_at = now() - interval '40 days'")

	out, stderr, code := f.cmd("cleanup", "--older-than", "720h")
	require.Equal(t, 0, code, stderr)
	inbox, ledger := cleanupLine(t, out, "idem_inbox"), cleanupLine(t, out, "idem_ledger")
	require.Equal(t, "1", inbox[1])
	require.Equal(t, "0", ledger[1], "settled effects keep 180 days by default")
	requireCutoff(t, 30, inbox)
	requireCutoff(t, 180, ledger)
	require.Equal(t, []string{"idem_ledger_tombstones", "0", "all"}, cleanupLine(t, out, "idem_ledger_tombstones"))
	require.Equal(t, []string{"idem_http_keys", "0", "until", "their", "expiry"}, cleanupLine(t, out, "idem_http_keys"))

	out, stderr, code = f.cmd("cleanup", "--older-than", "720h", "--ledger-older-than", "720h")
	require.Equal(t, 0, code, stderr)
	ledger = cleanupLine(t, out, "idem_ledger")
	require.Equal(t, "1", ledger[1])
	requireCutoff(t, 30, ledger)
	out, stderr, code = f.cmd("ledger", "show", f.effectID)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "this is its tombstone", "the effect is gone; its tombstone shows")
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.tables.Table("ledger_tombstones")+
		" WHERE effect_id = $1 AND status = 'succeeded'", f.effectID).Scan(&n))
	require.Equal(t, 1, n, "its tombstone stays")

	_, stderr, code = f.cmd("cleanup", "--older-than", "720h", "--tombstones-older-than", "24h")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--tombstones-older-than 24h0m0s is below the retention floor 168h0m0s")
	out, stderr, code = f.cmd("cleanup", "--older-than", "720h", "--tombstones-older-than", "8760h")
	require.Equal(t, 0, code, stderr)
	stones := cleanupLine(t, out, "idem_ledger_tombstones")
	require.Equal(t, "0", stones[1], "the tombstone is a day old")
	requireCutoff(t, 365, stones)
}

// cleanupLine returns the fields of the line of table in the output of
// idem cleanup.
func cleanupLine(t *testing.T, out, table string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == table {
			return f
		}
	}
	t.Fatalf("no line for %s in:\n%s", table, out)
	return nil
}

// requireCutoff checks that the line of a table says it keeps the last
// days.
func requireCutoff(t *testing.T, days int, line []string) {
	t.Helper()
	require.Len(t, line, 4)
	require.Equal(t, "since", line[2])
	at, err := time.Parse(time.RFC3339, line[3])
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(-time.Duration(days)*24*time.Hour), at, time.Minute)
}
