package timeparts_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/timeparts"
)

// indexes returns the definitions of the indexes of table (quoted),
// with the table's name and the index names' schema taken out, so that two
// schemas' tables compare.
func indexes(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, tables idem.Tables, name string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT replace(pg_get_indexdef(i.indexrelid), $2, '') FROM pg_index AS i
WHERE i.indrelid = to_regclass($1) ORDER BY 1`, tables.Table(name), tables.Schema+".")
	require.NoError(t, err)
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return defs
}

// LayOut makes an empty table again partitioned, with every index it had
// (its primary key extended by the partition column), its identity and
// defaults; a second LayOut with the same width does nothing, one with
// another width is refused, and a table that holds rows is refused with
// ErrHoldsRows and left as it was.
func TestLayOutKeepsTheIndexesIdentityAndDefaults(t *testing.T) {
	t.Parallel()
	pool, plain := testdb.Schema(t)
	_, tables := testdb.Schema(t)
	ctx := context.Background()
	tp := timeparts.New(tables, "dead_letters", "dead_lettered_at")
	layOut := func(width time.Duration) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tp.LayOut(ctx, tx, width) })
	}
	require.NoError(t, layOut(time.Minute))
	require.NoError(t, layOut(time.Minute), "the same width again")
	require.ErrorContains(t, layOut(time.Hour), "partitioned 1m0s wide already")
	w, err := tp.Width(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, time.Minute, w)

	want := indexes(t, pool, plain.WithDefaults(), "dead_letters")
	got := indexes(t, pool, tables.WithDefaults(), "dead_letters")
	require.Len(t, got, len(want))
	require.Contains(t, got, "CREATE UNIQUE INDEX "+tables.WithDefaults().Prefix+"dead_letters_pkey ON ONLY "+
		tables.WithDefaults().Prefix+"dead_letters USING btree (id, dead_lettered_at)")
	for i, def := range want {
		if def != "CREATE UNIQUE INDEX "+plain.WithDefaults().Prefix+"dead_letters_pkey ON "+plain.WithDefaults().Prefix+
			"dead_letters USING btree (id)" {
			require.Contains(t, got, replaceFirst(def, " ON ", " ON ONLY "), "index %d of the plain table", i)
		}
	}

	_, err = tp.Ensure(ctx, pool, 0)
	require.NoError(t, err)
	var id int64
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+tables.Table("dead_letters")+
		" (consumer, payload_hash, reason) VALUES ('c', '\\x00', 'r') RETURNING id, dead_lettered_at").Scan(&id, &at))
	require.EqualValues(t, 1, id, "the identity")
	require.WithinDuration(t, time.Now(), at, time.Minute, "the default")

	// A table that holds rows keeps its layout.
	rows := timeparts.New(plain, "dead_letters", "dead_lettered_at")
	_, err = pool.Exec(ctx, "INSERT INTO "+plain.Table("dead_letters")+" (consumer, payload_hash, reason) VALUES ('c', '\\x00', 'r')")
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return rows.LayOut(ctx, tx, time.Minute) })
	require.ErrorIs(t, err, timeparts.ErrHoldsRows)
	w, err = rows.Width(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, w)
}

// replaceFirst replaces the first old in s by new.
func replaceFirst(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}
