//go:build scale

package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// Invariant 18 through the operator's doors: every command that reads
// history does work in proportion to what it prints or deletes, on tables
// of a million rows and more. Run by `make scale` (go test -tags scale).

// history is a schema whose history tables hold rows enough that a
// statement reading more than it returns or deletes shows in the counters.
type history struct {
	tables idem.Tables
	// expired is how many rows of each table `idem cleanup --older-than
	// 48h` deletes.
	expired map[string]int64
}

// fillHistory fills every history table of a fresh schema: n rows older
// than 49 hours and n/10 younger than a day in the inbox, the dead letters,
// the attempts, the settled effects, the HTTP keys and operations, and n
// audit rows of n/1000 finished repair runs. Rows written in one
// transaction share one timestamp: batches of 100.
func fillHistory(t *testing.T, n int) *history {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ctx := t.Context()
	start := time.Now()
	// at is the timestamp of row i of n: from 30 days to 49 hours ago,
	// or, for young rows, within the last day.
	const at = `now() - interval '30 days' + (i / 100) * ((interval '30 days' - interval '49 hours') / ($1 / 100 + 1))`
	const young = `now() - (i % 1000) * interval '1 minute'`
	fills := map[string]string{
		"inbox": `INSERT INTO {t} (consumer, message_id, payload_hash, source, stream_offset, received_at)
SELECT 'c' || (i % 8), 'm-' || i, sha256(int8send(i)), 'orders', i, ` + at + ` FROM generate_series(1, $1::bigint) AS i
UNION ALL SELECT 'c' || (i % 8), 'y-' || i, sha256(int8send(i)), 'orders', $1 + i, ` + young + `
FROM generate_series(1, $1::bigint / 10) AS i`,
		"dead_letters": `INSERT INTO {t} (consumer, message_id, payload_hash, reason, error, source, dead_lettered_at)
SELECT 'c' || (i % 8), 'm-' || i, sha256(int8send(i)), CASE WHEN i % 10 = 0 THEN 'payload_conflict' ELSE 'max_attempts' END,
	'gateway down', 'orders', CASE WHEN i > $1 THEN ` + young + ` ELSE ` + at + ` END
FROM generate_series(1, $1::bigint * 11 / 10) AS i`,
		"attempts": `INSERT INTO {t} (consumer, message_id, failures, updated_at)
SELECT 'c' || (i % 8), 'm-' || i, 1, CASE WHEN i > $1 THEN ` + young + ` ELSE ` + at + ` END
FROM generate_series(1, $1::bigint * 11 / 10) AS i`,
		"ledger": `INSERT INTO {t} (effect_id, effect_type, consumer, message_id, business_key, idempotency_key, request_hash, request,
	status, created_at, completed_at, next_attempt_at)
SELECT 'e-' || i, 'mail', 'c' || (i % 8), 'm-' || i, 'o-' || i, 'k-' || i, sha256(int8send(i)), '{}',
	CASE WHEN i > $1 THEN 'pending' ELSE 'succeeded' END, ` + at + `, CASE WHEN i <= $1 THEN ` + at + ` END, ` + at + `
FROM generate_series(1, $1::bigint * 11 / 10) AS i`,
		"http_keys": `INSERT INTO {t} (key_id, tenant, caller, operation, idempotency_key, fingerprint, state, status_code,
	created_at, completed_at, expires_at)
SELECT sha256(int8send(i)), 't', 'caller-' || (i % 50), 'POST /orders', 'k-' || i, sha256(int8send(-i)), 'completed', 201,
	` + at + `, ` + at + `, CASE WHEN i > $1 THEN now() + interval '1 day' ELSE ` + at + ` + interval '1 hour' END
FROM generate_series(1, $1::bigint * 11 / 10) AS i`,
		"http_operations": `INSERT INTO {t} (operation_id, tenant, caller, kind, state, location, fields, created_at, updated_at,
	finished_at, expires_at)
SELECT 'op-' || i, 't', 'caller-' || (i % 50), 'export', 'succeeded', '/operations/op-' || i, '{}', ` + at + `, ` + at + `,
	` + at + `, CASE WHEN i > $1 THEN now() + interval '1 day' ELSE ` + at + ` + interval '1 hour' END
FROM generate_series(1, $1::bigint * 11 / 10) AS i`,
		"replay_runs": `INSERT INTO {t} (run_id, mode, consumer, stream, from_position, to_position, end_offset, operator, reason,
	status, started_at, finished_at)
SELECT 'r-' || i, 'repair', 'c' || (i % 8), 'orders', 'first', 'tail', 1000, 'alice', 'INC-' || i, 'finished',
	` + at + `, ` + at + ` FROM generate_series(1, $1::bigint / 1000) AS i`,
		"replay_audit": `INSERT INTO {t} (run_id, consumer, stream, stream_offset, message_id, payload_hash, inbox, outcome,
	operator, reason, audited_at)
SELECT 'r-' || (i / 1000 + 1), 'c' || ((i / 1000 + 1) % 8), 'orders', i, 'm-' || i, sha256(int8send(i)), 'duplicate',
	'processed', 'alice', 'INC', now() FROM generate_series(0, $1::bigint - 1) AS i`,
	}
	h := &history{tables: tables, expired: map[string]int64{}}
	for table, sql := range fills {
		_, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{t}", tables.Table(table)), n)
		require.NoError(t, err, table)
		_, err = pool.Exec(ctx, `ANALYZE `+tables.Table(table))
		require.NoError(t, err, table)
	}
	for _, table := range []string{"inbox", "dead_letters", "attempts", "ledger", "http_keys", "http_operations", "replay_audit"} {
		h.expired[table] = int64(n)
	}
	h.expired["replay_runs"] = int64(n / 1000)
	t.Logf("filled %d tables with %d rows each in %v", len(fills), n, time.Since(start).Round(time.Millisecond))
	return h
}

// idem runs the command args on h's schema, as an application of its own,
// and returns what it cost each table.
func (h *history) idem(t *testing.T, args ...string) (testdb.Work, string) {
	t.Helper()
	app := testdb.Name(t, "idem")
	var out, stderr string
	var code int
	work := testdb.NewMeter(t, h.tables.Schema).AwaitExit(app).Measure(func() {
		out, stderr, code = idemCmd(append(args, "--pg-url", testdb.AppURL(app), "--schema", h.tables.Schema)...)
	})
	require.Equal(t, 0, code, "idem %v: %s", args, stderr)
	return work, out
}

// The acceptance check of invariant 18: `idem cleanup` on a million
// expired rows in every history table, with a snapshot held open, reads at
// most a few rows or index entries per row it deletes, in each table.
func TestScaleIdemCleanupReadsEachExpiredRowOnceUnderAnOpenSnapshot(t *testing.T) {
	h := fillHistory(t, 1_000_000)
	testdb.HoldSnapshot(t)
	work, out := h.idem(t, "cleanup", "--floor", "1h", "--older-than", "48h", "--ledger-older-than", "48h", "--json")
	t.Log(out)
	for table, n := range h.expired {
		require.Equal(t, n, work[h.tables.WithDefaults().Prefix+table].Deleted, "rows deleted from %s", table)
	}
	work.RequirePerDeleted(t, "idem cleanup")
}

// The operator's lists and counts read what they print, at depth: a
// million rows in every table they read.
func TestScaleIdemListsReadWhatTheyPrint(t *testing.T) {
	h := fillHistory(t, 1_000_000)
	for _, c := range []struct {
		args []string
		rows int64
	}{
		{[]string{"deadletters", "list"}, 100},
		{[]string{"deadletters", "list", "--consumer", "c3"}, 100},
		{[]string{"deadletters", "list", "--reason", "payload_conflict"}, 100},
		{[]string{"deadletters", "list", "--consumer", "c3", "--id", "m-3"}, 1},
		{[]string{"ledger", "list"}, 100},
		{[]string{"ledger", "list", "--status", "pending"}, 100},
		{[]string{"ledger", "list", "--consumer", "c3"}, 100},
		{[]string{"ledger", "list", "--consumer", "c3", "--status", "pending"}, 100},
		{[]string{"ledger", "stats"}, 7},
		{[]string{"http-keys", "list"}, 100},
		{[]string{"http-keys", "list", "--state", "completed"}, 100},
		{[]string{"operations", "list"}, 100},
		{[]string{"operations", "list", "--state", "succeeded"}, 100},
		{[]string{"replay", "runs"}, 100},
		{[]string{"inbox", "stats"}, 8},
		{[]string{"inbox", "show", "--consumer", "c3", "--id", "m-3"}, 1},
	} {
		t.Run(fmt.Sprint(c.args), func(t *testing.T) {
			work, _ := h.idem(t, c.args...)
			work.RequirePerRow(t, fmt.Sprint(c.args), c.rows)
		})
	}
}
