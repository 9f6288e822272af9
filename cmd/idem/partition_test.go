package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// idem migrate --partition-width lays the inbox out in partitions; idem
// cleanup then drops whole partitions and records their horizon.
func TestMigratePartitionWidthThenCleanupDropsWholePartitions(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	tables := idem.Tables{Schema: testdb.Name(t, "cli")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	common := []string{"--pg-url", testdb.URL(), "--schema", tables.Schema}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, append([]string{"migrate", "--partition-width", "1m"}, common...), &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "partitioned 1m0s wide")
	var kind string
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", tables.Table("inbox")).Scan(&kind))
	require.Equal(t, "p", kind)
	out.Reset()
	require.Equal(t, 0, run(ctx, append([]string{"migrate", "--partition-width", "1m"}, common...), &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "is up to date")
	errOut.Reset()
	require.NotEqual(t, 0, run(ctx, append([]string{"migrate", "--partition-width", "2m"}, common...), &out, &errOut))
	require.Contains(t, errOut.String(), "partitioned 1m0s wide already")

	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	for i := range int64(5) {
		id := fmt.Sprintf("m-%d", i)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ib.Claim(ctx, tx, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: idem.HashBytes([]byte(id)), Source: "s", StreamOffset: &i})
			return err
		}))
	}
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+` SET received_at = now() - interval '3 hours'`)
	require.NoError(t, err)

	out.Reset()
	errOut.Reset()
	args := append([]string{"cleanup", "--older-than", "1h", "--floor", "1h"}, common...)
	require.Equal(t, 0, run(ctx, args, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "idem_inbox: dropped 1 whole partitions")
	h, ok, err := ib.Horizon(ctx, pool, "c", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(4), *h.Offset)
}

// idem migrate --partition-width on an inbox that holds rows converts it
// online: the rows stay, in the legacy partition, and their copies are
// still duplicates.
func TestMigratePartitionWidthConvertsAnInboxWithHistory(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	tables := idem.Tables{Schema: testdb.Name(t, "cli")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	common := []string{"--pg-url", testdb.URL(), "--schema", tables.Schema}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, append([]string{"migrate"}, common...), &out, &errOut), errOut.String())
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	changed := 0
	claim := func(id string) inbox.Decision {
		var res inbox.Result
		do := func(tx pgx.Tx) error {
			var err error
			res, err = ib.Claim(ctx, tx, inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: idem.HashBytes([]byte(id)), Source: "s"})
			return err
		}
		err := pgx.BeginFunc(ctx, pool, do)
		if errors.Is(err, inbox.ErrLayoutChanged) { // once, as the runtime does
			changed++
			err = pgx.BeginFunc(ctx, pool, do)
		}
		require.NoError(t, err)
		return res.Decision
	}
	for i := range 5 {
		require.Equal(t, inbox.NewMessage, claim(fmt.Sprintf("m-%d", i)))
	}

	out.Reset()
	require.Equal(t, 0, run(ctx, append([]string{"migrate", "--partition-width", "1m"}, common...), &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "partitioned 1m0s wide")
	var kind string
	var legacy int
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", tables.Table("inbox")).Scan(&kind))
	require.Equal(t, "p", kind)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("inbox_legacy")).Scan(&legacy))
	require.Equal(t, 5, legacy)
	for i := range 5 {
		require.Equal(t, inbox.Duplicate, claim(fmt.Sprintf("m-%d", i)), "an Inbox that read the plain layout")
	}
	require.Equal(t, inbox.NewMessage, claim("m-5"))
	require.Equal(t, 1, changed, "the Inbox met the conversion once")
}
