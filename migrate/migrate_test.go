package migrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/migrate"
)

// freshTables returns tables in a schema that does not exist yet and drops
// the schema when the test ends.
func freshTables(t *testing.T, schema, prefix string) idem.Tables {
	t.Helper()
	pool := testdb.Pool(t)
	tables := idem.Tables{Schema: schema, Prefix: prefix}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", tables.Schema, err)
		}
	})
	return tables
}

func versions(t *testing.T) []int {
	t.Helper()
	ms, err := migrate.All(idem.Tables{})
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = m.Version
	}
	return out
}

// recorded returns the versions in the migrations table, in order.
func recorded(t *testing.T, pool *pgxpool.Pool, tables idem.Tables) []int {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT version FROM "+tables.Table("migrations")+" ORDER BY version")
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return vs
}

func TestUpTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	tables := freshTables(t, testdb.Name(t, "m"), "")
	all := versions(t)

	res, err := migrate.Up(t.Context(), pool, tables)
	require.NoError(t, err)
	require.Equal(t, all, res.Applied)
	require.Equal(t, all[len(all)-1], res.Current)

	res, err = migrate.Up(t.Context(), pool, tables)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	require.Equal(t, all[len(all)-1], res.Current)
	require.Equal(t, all, recorded(t, pool, tables))
}

func TestConcurrentMigratorsApplyEachVersionOnce(t *testing.T) {
	t.Parallel()
	testdb.Pool(t) // skip or fail early when PostgreSQL is unreachable
	tables := freshTables(t, testdb.Name(t, "m"), "")
	const migrators = 5

	// Each migrator is its own process in miniature: its own pool.
	pools := make([]*pgxpool.Pool, migrators)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(testdb.URL())
		require.NoError(t, err)
		cfg.MaxConns = 1
		p, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		require.NoError(t, p.Ping(t.Context()))
		pools[i] = p
	}

	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]migrate.Result, migrators)
		errs    = make([]error, migrators)
	)
	for i, p := range pools {
		wg.Go(func() {
			<-start
			results[i], errs[i] = migrate.Up(t.Context(), p, tables)
		})
	}
	close(start)
	wg.Wait()

	all := versions(t)
	appliedBy := map[int]int{}
	for i := range migrators {
		require.NoError(t, errs[i], "migrator %d", i)
		require.Equal(t, all[len(all)-1], results[i].Current)
		for _, v := range results[i].Applied {
			appliedBy[v]++
		}
	}
	for _, v := range all {
		require.Equal(t, 1, appliedBy[v], "version %d applied by %d migrators", v, appliedBy[v])
	}
	require.Equal(t, all, recorded(t, pools[0], tables))
}

func TestHostileSchemaAndPrefixAreQuotedNotExecuted(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := t.Context()
	// If the names were pasted into SQL unquoted, this would drop canary.
	name := testdb.Name(t, "c")
	canary := "canary_" + name[len(name)-10:] // the random part
	_, err := pool.Exec(ctx, "CREATE TABLE public."+canary+" (x int)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS public."+canary)
	})

	schema := `x"; DROP TABLE public.` + canary + `; --`
	prefix := `p'";--_`
	tables := freshTables(t, schema, prefix)
	require.NoError(t, tables.Validate())

	res, err := migrate.Up(ctx, pool, tables)
	require.NoError(t, err)
	require.Equal(t, versions(t), res.Applied)
	res, err = migrate.Up(ctx, pool, tables)
	require.NoError(t, err)
	require.Empty(t, res.Applied)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM public."+canary).Scan(&n), "canary table must survive")
	var tablesInSchema []string
	rows, err := pool.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema)
	require.NoError(t, err)
	tablesInSchema, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, tablesInSchema, prefix+"inbox")
	require.Contains(t, tablesInSchema, prefix+"migrations")
	for _, name := range tablesInSchema {
		require.True(t, strings.HasPrefix(name, prefix), name)
	}

	// The SQL for external tools quotes the same way.
	script, err := migrate.SQL(tables)
	require.NoError(t, err)
	require.Contains(t, script, `CREATE SCHEMA IF NOT EXISTS "x""; DROP TABLE public.`+canary+`; --";`)
}

func TestSQLScriptMatchesUp(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := t.Context()
	tables := freshTables(t, testdb.Name(t, "m"), "q_")
	script, err := migrate.SQL(tables)
	require.NoError(t, err)
	ms, err := migrate.All(tables)
	require.NoError(t, err)
	for _, m := range ms {
		require.Contains(t, script, m.SQL[:min(len(m.SQL), 60)])
	}

	// A team applies the script with its own tool; Up then finds nothing to do.
	_, err = pool.Exec(ctx, script)
	require.NoError(t, err)
	res, err := migrate.Up(ctx, pool, tables)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	require.Equal(t, versions(t), recorded(t, pool, tables))
}

func TestInvalidTablesAreRefused(t *testing.T) {
	t.Parallel()
	for _, tables := range []idem.Tables{
		{Schema: "a\x00b"},
		{Schema: strings.Repeat("s", 64)},
		{Prefix: strings.Repeat("p", 40)},
	} {
		_, err := migrate.SQL(tables)
		require.ErrorIs(t, err, idem.ErrInvalidTables)
		_, err = migrate.All(tables)
		require.ErrorIs(t, err, idem.ErrInvalidTables)
	}
}

func TestLockKeyDependsOnSchema(t *testing.T) {
	t.Parallel()
	require.Equal(t, migrate.LockKey("a"), migrate.LockKey("a"))
	require.NotEqual(t, migrate.LockKey("a"), migrate.LockKey("b"))
}
