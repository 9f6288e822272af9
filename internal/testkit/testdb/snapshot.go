package testdb

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HoldSnapshot opens a connection of its own (outside every pool) with a
// REPEATABLE READ transaction that has read something, as a long report or
// a replica's feedback would: until the test ends, VACUUM and page pruning
// keep every row deleted or updated after this moment, dead, in the tables
// and their indexes. It checks that the server counts the snapshot in its
// horizon (backend_xmin).
func HoldSnapshot(tb testing.TB) {
	tb.Helper()
	Pool(tb) // skip or fail like every database test when there is none
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		tb.Fatalf("testdb: hold a snapshot: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	})
	var held bool
	if _, err = conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err == nil {
		err = conn.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_class`).Scan(&held)
	}
	if err == nil {
		err = conn.QueryRow(ctx, `SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&held)
	}
	if err != nil || !held {
		tb.Fatalf("testdb: hold a snapshot: held %v, %v", held, err)
	}
}

// Plan cache modes: PostgreSQL plans a prepared statement for each
// execution's values (custom) or once for any values (generic), and may
// switch to the generic plan after five executions.
const (
	CustomPlans  = "force_custom_plan"
	GenericPlans = "force_generic_plan"
)

// PlanPool returns a pool of its own whose sessions plan prepared
// statements in mode (CustomPlans or GenericPlans; "" leaves the server's
// choice), closed when the test ends.
func PlanPool(tb testing.TB, mode string) *pgxpool.Pool {
	tb.Helper()
	cfg := Pool(tb).Config()
	if mode != "" {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = mode
	}
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: pool planning in %s: %v", mode, err)
	}
	tb.Cleanup(p.Close)
	return p
}
