package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// runInboxCmd runs `idem ARGS --pg-url … --schema …` against tables.
func runInboxCmd(t *testing.T, tables idem.Tables, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append(args, "--pg-url", testdb.URL(), "--schema", tables.Schema)
	code = run(context.Background(), full, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestInboxShowPrintsTheRowAndFailsWhenAbsent(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	off := int64(981)
	h := idem.HashBytes([]byte(`{"order":"o-7"}`))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.Claim(ctx, tx, inbox.Claim{Consumer: "billing", MessageID: "m-1", PayloadHash: h,
			BusinessKey: "order-7", Source: "orders.stream", StreamOffset: &off})
		return err
	}))

	out, stderr, code := runInboxCmd(t, tables, "inbox", "show", "--consumer", "billing", "--id", "m-1")
	require.Equal(t, 0, code, stderr)
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		fields[k] = strings.TrimSpace(v)
	}
	require.Equal(t, "billing", fields["consumer"])
	require.Equal(t, "m-1", fields["message_id"])
	require.Equal(t, h.String(), fields["payload_hash"])
	require.Equal(t, "order-7", fields["business_key"])
	require.Equal(t, "orders.stream", fields["source"])
	require.Equal(t, "981", fields["stream_offset"])
	require.NotEmpty(t, fields["received_at"])

	out, stderr, code = runInboxCmd(t, tables, "inbox", "show", "--consumer", "billing", "--id", "m-2")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, stderr, "not found")

	_, stderr, code = runInboxCmd(t, tables, "inbox", "show", "--consumer", "billing")
	require.Equal(t, 2, code, "--id is required")
	require.Contains(t, stderr, "--id")
}

func TestInboxStatsAndCleanupCommands(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	var claims []inbox.Claim
	for _, c := range []struct{ consumer, id string }{{"a", "1"}, {"a", "2"}, {"a", "3"}, {"b", "1"}} {
		claims = append(claims, inbox.Claim{Consumer: c.consumer, MessageID: c.id, PayloadHash: idem.HashBytes([]byte(c.id))})
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.ClaimBatch(ctx, tx, claims)
		return err
	}))
	// A receipt per row: a cleanup chunk takes every row of the receipt it ends on.
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+
		" SET received_at = now() - interval '30 days' - message_id::int * interval '1 minute' WHERE message_id <> '3'")
	require.NoError(t, err)

	out, stderr, code := runInboxCmd(t, tables, "inbox", "stats")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, []string{"CONSUMER", "ROWS", "OLDEST", "NEWEST"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"a", "3"}, strings.Fields(lines[1])[:2])
	require.Equal(t, []string{"b", "1"}, strings.Fields(lines[2])[:2])

	_, stderr, code = runInboxCmd(t, tables, "inbox", "cleanup", "--older-than", "1h")
	require.Equal(t, 1, code, "below the 7-day floor")
	require.Contains(t, stderr, "floor")
	_, stderr, code = runInboxCmd(t, tables, "inbox", "cleanup")
	require.Equal(t, 2, code, "--older-than is required")
	require.Contains(t, stderr, "--older-than")

	out, stderr, code = runInboxCmd(t, tables, "inbox", "cleanup", "--older-than", "168h", "--consumer", "a", "--chunk-size", "1")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "deleted 2 rows older than 168h0m0s in 2 chunks\n", out)

	out, stderr, code = runInboxCmd(t, tables, "inbox", "cleanup", "--older-than", "168h")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "deleted 1 rows older than 168h0m0s in 1 chunks\n", out)

	stats, err := ib.Stats(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []inbox.ConsumerStats{{Consumer: "a", Rows: 1, Oldest: stats[0].Oldest, Newest: stats[0].Newest}}, stats)
}

func TestInboxCommandWantsASubcommand(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"inbox"}, &out, &errOut))
	require.Contains(t, errOut.String(), "idem inbox show")
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"inbox", "purge"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unknown subcommand "purge"`)
}

// `idem inbox cleanup` has the same floor as `idem cleanup`: a row younger
// than the floor may still be needed to recognise a redelivered message.
// What a cleanup forgets shows in `idem inbox horizon`.
func TestInboxCleanupHasTheRetentionFloorAndRecordsTheHorizon(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	off := int64(41)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.Claim(ctx, tx, inbox.Claim{Consumer: "a", MessageID: "m", PayloadHash: idem.HashBytes([]byte("m")),
			Source: "s", StreamOffset: &off})
		return err
	}))
	_, err = pool.Exec(ctx, "UPDATE "+tables.Table("inbox")+" SET received_at = now() - interval '5 days'")
	require.NoError(t, err)

	for _, cmd := range [][]string{{"inbox", "cleanup"}, {"cleanup"}} {
		_, stderr, code := runInboxCmd(t, tables, append(cmd, "--older-than", "72h")...)
		require.Equal(t, 1, code, "%v: 72h is below the 7-day floor", cmd)
		require.Contains(t, stderr, "below the retention floor 168h0m0s")
	}
	_, err = ib.Lookup(ctx, pool, "a", "m")
	require.NoError(t, err, "nothing deleted")

	out, stderr, code := runInboxCmd(t, tables, "inbox", "horizon", "--consumer", "a")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, strings.Count(out, "\n"), "the header only: nothing forgotten")

	out, stderr, code = runInboxCmd(t, tables, "inbox", "cleanup", "--older-than", "72h", "--floor", "72h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "deleted 1 rows")
	out, stderr, code = runInboxCmd(t, tables, "inbox", "horizon", "--consumer", "a", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"forgotten_offset": 41`)
}
