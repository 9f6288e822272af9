package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// cliFixture is a migrated schema with a row in every table the commands
// read: an inbox row (billing, m-1), an effect, a dead letter and a finished
// repair run with one audit row.
type cliFixture struct {
	t        *testing.T
	pool     *pgxpool.Pool
	tables   idem.Tables
	effectID string
}

func newCLIFixture(t *testing.T) *cliFixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	f := &cliFixture{t: t, pool: pool, tables: tables}
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	off := int64(7)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := ib.Claim(ctx, tx, inbox.Claim{Consumer: "billing", MessageID: "m-1",
			PayloadHash: idem.HashBytes([]byte("m-1")), Source: "orders", StreamOffset: &off}); err != nil {
			return err
		}
		e, err := l.Record(ctx, tx, ledger.Effect{Type: "mail", BusinessKey: "o-1", Request: map[string]string{"to": "a@b.c"},
			Consumer: "billing", MessageID: "m-1"})
		f.effectID = e.ID
		return err
	}))
	h := idem.HashBytes([]byte("m-2"))
	f.exec("INSERT INTO "+tables.Table("dead_letters")+` (consumer, message_id, payload_hash, reason, error)
		VALUES ('billing', 'm-2', $1, 'max_attempts', 'gateway down')`, h[:])
	f.exec("INSERT INTO " + tables.Table("replay_runs") + ` (run_id, mode, consumer, stream, from_position, to_position,
		end_offset, operator, reason, status, finished_at, audited) VALUES ('r-1', 'repair', 'billing', 'orders', 'first', 'tail', 9,
		'alice', 'INC-1', 'finished', now(), 1)`)
	f.exec("INSERT INTO "+tables.Table("replay_audit")+` (run_id, consumer, stream, stream_offset, message_id, payload_hash,
		inbox, outcome, operator, reason) VALUES ('r-1', 'billing', 'orders', 7, 'm-1', $1, 'duplicate', 'processed', 'alice', 'INC-1')`, h[:])
	return f
}

func (f *cliFixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), sql, args...)
	require.NoError(f.t, err)
}

// cmd runs `idem ARGS --pg-url … --schema …` on the fixture's schema.
func (f *cliFixture) cmd(args ...string) (stdout, stderr string, code int) {
	return idemCmd(append(args, "--pg-url", testdb.URL(), "--schema", f.tables.Schema)...)
}
