package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/migrate"
)

func TestMigratePrintSQLNeedsNoDatabaseAndQuotesNames(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	args := []string{"migrate", "--print-sql", "--schema", `ten"ant`, "--prefix", "app_", "--pg-url", "postgres://nobody@127.0.0.1:1/none"}
	code := run(context.Background(), args, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())

	tables := idem.Tables{Schema: `ten"ant`, Prefix: "app_"}
	want, err := migrate.SQL(tables)
	require.NoError(t, err)
	require.Equal(t, want, out.String())
	require.True(t, strings.HasPrefix(out.String(), `CREATE SCHEMA IF NOT EXISTS "ten""ant";`), out.String())
	require.Contains(t, out.String(), `CREATE TABLE "ten""ant"."app_inbox"`)
	ms, err := migrate.All(tables)
	require.NoError(t, err)
	for _, m := range ms {
		require.Contains(t, out.String(), fmt.Sprintf("-- idem migration %04d_%s\n", m.Version, m.Name))
	}
}

func TestMigratePrintedSQLAppliesAndUpAgreesItIsCurrent(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	tables := idem.Tables{Schema: testdb.Name(t, "cli"), Prefix: "x_"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	common := []string{"--pg-url", testdb.URL(), "--schema", tables.Schema, "--prefix", tables.Prefix}

	var script, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, append([]string{"migrate", "--print-sql"}, common...), &script, &errOut), errOut.String())
	_, err := pool.Exec(ctx, script.String())
	require.NoError(t, err, "the printed script is what an external migration tool runs")

	var out bytes.Buffer
	require.Equal(t, 0, run(ctx, append([]string{"migrate"}, common...), &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "is up to date")
}

func TestMigrateAppliesOnceThenReportsUpToDate(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	tables := idem.Tables{Schema: testdb.Name(t, "cli")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	args := []string{"migrate", "--pg-url", testdb.URL(), "--schema", tables.Schema}

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, args, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "applied")
	out.Reset()
	require.Equal(t, 0, run(ctx, args, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "is up to date")
}
