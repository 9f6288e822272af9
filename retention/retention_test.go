package retention_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/retention"
)

const day = 24 * time.Hour

// fixture seeds rows of every table idem owns, old (40 days) and young (1
// day), through plain SQL.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	return &fixture{t: t, pool: pool, tables: tables}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), sql, args...)
	require.NoError(f.t, err)
}

func (f *fixture) count(table, where string) int {
	f.t.Helper()
	var n int
	q := "SELECT count(*) FROM " + f.tables.Table(table)
	if where != "" {
		q += " WHERE " + where
	}
	require.NoError(f.t, f.pool.QueryRow(context.Background(), q).Scan(&n))
	return n
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func (f *fixture) inbox(id string, age time.Duration) {
	f.exec("INSERT INTO "+f.tables.Table("inbox")+` (consumer, message_id, payload_hash, received_at)
		VALUES ('c', $1, $2, now() - $3::interval)`, id, hash(id), age.String())
}

// effect inserts an effect in status, settled (or created) age ago, with an
// audit row per resolution to each of resolvedAs, oldest first.
func (f *fixture) effect(id, status string, age time.Duration, resolvedAs ...string) {
	f.exec("INSERT INTO "+f.tables.Table("ledger")+` (effect_id, effect_type, business_key, idempotency_key,
		request_hash, request, status, created_at, completed_at)
		VALUES ($1, 'mail', $1, $1, $2, '{}', $3, now() - $4::interval,
			CASE WHEN $3 IN ('succeeded', 'failed_terminal') THEN now() - $4::interval END)`,
		id, hash(id), status, age.String())
	for i, to := range resolvedAs {
		f.exec("INSERT INTO "+f.tables.Table("ledger_audit")+` (effect_id, operator, from_status, to_status, reason, resolved_at)
			VALUES ($1, 'ops', 'unknown', $2, 'checked', now() - $3::interval + $4 * interval '1 second')`, id, to, age.String(), i)
	}
}

func (f *fixture) deadLetter(id string, age time.Duration) {
	f.exec("INSERT INTO "+f.tables.Table("dead_letters")+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
		VALUES ('c', $1, $2, 'max_attempts', now() - $3::interval)`, id, hash(id), age.String())
}

// run inserts a replay run with two audit rows and its progress checkpoint;
// a finished run finished age ago.
func (f *fixture) run(id string, finished bool, age time.Duration) {
	status := "running"
	if finished {
		status = "finished"
	}
	f.exec("INSERT INTO "+f.tables.Table("replay_runs")+` (run_id, mode, consumer, stream, from_position, to_position,
		end_offset, status, started_at, finished_at)
		VALUES ($1, 'repair', 'c', 's', 'first', 'tail', 9, $2, now() - $3::interval - interval '1 hour',
			CASE WHEN $2 = 'finished' THEN now() - $3::interval END)`, id, status, age.String())
	for i := range 2 {
		f.exec("INSERT INTO "+f.tables.Table("replay_audit")+` (run_id, consumer, stream, stream_offset, message_id,
			payload_hash, inbox, outcome, operator, reason) VALUES ($1, 'c', 's', $2, $3, $4, 'duplicate', 'processed', 'ops', 'fix')`,
			id, i, fmt.Sprintf("%s-m%d", id, i), hash(id))
	}
	f.exec("INSERT INTO "+f.tables.Table("checkpoints")+` (consumer, stream, last_offset) VALUES ($1, 's', 9)`, "c@replay:"+id)
}

// attempts inserts a message's attempts row last updated age ago.
func (f *fixture) attempts(id string, age time.Duration) {
	f.exec("INSERT INTO "+f.tables.Table("attempts")+` (consumer, message_id, failures, updated_at)
		VALUES ('c', $1, 2, now() - $2::interval)`, id, age.String())
}

func (f *fixture) httpKey(id string, expired bool) {
	expires := "now() + interval '1 hour'"
	if expired {
		expires = "now() - interval '1 hour'"
	}
	f.exec("INSERT INTO "+f.tables.Table("http_keys")+` (key_id, tenant, caller, operation, idempotency_key,
		fingerprint, state, expires_at) VALUES ($1, '', '', 'op', $2, $1, 'completed', `+expires+`)`, hash(id), id)
}

func TestCleanDeletesOnlySettledRowsOlderThanTheCutoffFromEveryTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	old, young := 40*day, day
	for i := range 5 {
		f.inbox(fmt.Sprintf("old-%d", i), old)
	}
	f.inbox("young", young)

	f.effect("succeeded", "succeeded", old, "succeeded")
	f.effect("suppressed", "suppressed", old)
	f.effect("acknowledged-failure", "failed_terminal", old, "failed_terminal")
	f.effect("unresolved-failure", "failed_terminal", old)
	f.effect("failed-then-retried", "failed_terminal", old, "failed_terminal", "pending")
	for _, s := range []string{"pending", "in_flight", "unknown", "failed_retryable"} {
		f.effect("open-"+s, s, old, "pending")
	}
	f.effect("young-succeeded", "succeeded", young)

	f.deadLetter("old-1", old)
	f.deadLetter("old-2", old)
	f.deadLetter("young", young)

	f.run("old-finished", true, old)
	f.run("old-unfinished", false, old)
	f.run("young-finished", true, young)

	f.attempts("old", old)
	f.attempts("young", young)

	f.httpKey("expired", true)
	f.httpKey("live", false)

	cfg := retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 30 * day, LedgerOlderThan: 30 * day, ChunkSize: 2}
	res, err := retention.Clean(t.Context(), cfg)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(-30*day), res.Cutoff, time.Minute)
	want := []retention.Count{
		{Table: "inbox", Deleted: 5},
		{Table: "ledger", Deleted: 3},
		{Table: "ledger_audit", Deleted: 2},
		{Table: "ledger_tombstones", Deleted: 0},
		{Table: "dead_letters", Deleted: 2},
		{Table: "replay_runs", Deleted: 1},
		{Table: "replay_audit", Deleted: 2},
		{Table: "checkpoints", Deleted: 1},
		{Table: "attempts", Deleted: 1},
		{Table: "http_keys", Deleted: 1},
	}
	require.Equal(t, want, deletedOnly(res.Counts))
	require.Equal(t, int64(18), res.Total())
	require.Equal(t, 3, f.count("ledger_tombstones", ""), "each deleted effect left its tombstone")
	require.Equal(t, 1, f.count("attempts", ""), "the young attempts row stays")

	require.Equal(t, 1, f.count("inbox", ""))
	var left []string
	rows, err := f.pool.Query(t.Context(), "SELECT effect_id FROM "+f.tables.Table("ledger")+" ORDER BY 1")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"failed-then-retried", "open-failed_retryable", "open-in_flight", "open-pending",
		"open-unknown", "unresolved-failure", "young-succeeded"}, left,
		"open effects, failures no operator acknowledged and young effects stay")
	require.Equal(t, 6, f.count("ledger_audit", ""), "the kept effects keep their audit")
	require.Equal(t, 1, f.count("dead_letters", ""))
	require.Equal(t, 0, f.count("replay_runs", "run_id = 'old-finished'"))
	require.Equal(t, 2, f.count("replay_runs", ""), "an unfinished run can still be resumed")
	require.Equal(t, 4, f.count("replay_audit", ""))
	require.Equal(t, 2, f.count("checkpoints", ""))
	require.Equal(t, 1, f.count("http_keys", ""))

	res, err = retention.Clean(t.Context(), cfg)
	require.NoError(t, err)
	require.Zero(t, res.Total(), "a second run finds nothing")
	require.Len(t, res.Counts, len(want), "every table is reported, even with nothing to delete")
}

// deletedOnly returns counts without their cutoffs.
func deletedOnly(counts []retention.Count) []retention.Count {
	out := make([]retention.Count, len(counts))
	for i, c := range counts {
		out[i] = retention.Count{Table: c.Table, Deleted: c.Deleted}
	}
	return out
}

func TestCleanRefusesToCutBelowTheReplayHorizonFloor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.inbox("m", 3*day)
	f.deadLetter("m", 3*day)

	for _, cfg := range []retention.Config{
		{OlderThan: 2 * day},                              // below the default floor
		{OlderThan: retention.DefaultFloor - time.Second}, // just below
		{OlderThan: 2 * day, Floor: 60 * day},             // below a raised floor
		{OlderThan: 30 * day, LedgerOlderThan: 2 * day},   // the ledger's own, below the floor
		{OlderThan: 30 * day, TombstonesOlderThan: day},   // the tombstones', below the floor
	} {
		cfg.Pool, cfg.Tables = f.pool, f.tables
		res, err := retention.Clean(t.Context(), cfg)
		require.ErrorIs(t, err, retention.ErrBelowFloor, "%+v", cfg)
		require.Zero(t, res.Total())
		require.ErrorIs(t, retention.Run(t.Context(), cfg), retention.ErrBelowFloor, "Run refuses before it schedules anything")
	}
	require.Equal(t, 1, f.count("inbox", ""), "a refused cleanup deletes nothing")
	require.Equal(t, 1, f.count("dead_letters", ""))

	// A deliberately lowered floor is honoured, below the inbox's own guard too.
	res, err := retention.Clean(t.Context(), retention.Config{Pool: f.pool, Tables: f.tables, OlderThan: 2 * day, Floor: day})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Deleted("inbox"))
	require.Equal(t, int64(1), res.Deleted("dead_letters"))
}

func TestCleanRejectsAConfigItCannotUse(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, cfg := range []retention.Config{
		{OlderThan: 30 * day},
		{Pool: pool},
		{Pool: pool, OlderThan: 30 * day, ChunkSize: -1},
		{Pool: pool, OlderThan: 30 * day, Tables: idem.Tables{Schema: string(make([]byte, 64))}},
	} {
		_, err := retention.Clean(t.Context(), cfg)
		require.ErrorIs(t, err, retention.ErrInvalidConfig)
	}
}
