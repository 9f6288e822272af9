package main

import (
	"encoding/json"
	"strings"
	"testing"

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
			Table   string `json:"table"`
			Deleted int64  `json:"deleted"`
		} `json:"tables"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.NotEmpty(t, res.Cutoff)
	deleted := map[string]int64{}
	for _, c := range res.Tables {
		deleted[c.Table] = c.Deleted
	}
	require.Equal(t, map[string]int64{"inbox": 1, "ledger": 0, "ledger_audit": 0, "dead_letters": 1, "replay_runs": 0,
		"replay_audit": 0, "checkpoints": 0, "attempts": 0, "http_keys": 0}, deleted)

	f.exec("UPDATE " + f.tables.Table("replay_runs") + " SET finished_at = now() - interval '2 hours'")
	out, stderr, code = f.cmd("cleanup", "--older-than", "1h", "--floor", "1h")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 10, out)
	require.Contains(t, lines[0], "TABLE")
	require.Regexp(t, `^idem_inbox\s+0$`, lines[1])
	require.Regexp(t, `^idem_replay_runs\s+1$`, lines[5], "the run finished two hours ago")
	require.Regexp(t, `^idem_replay_audit\s+1$`, lines[6])
}
