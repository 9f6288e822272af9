package consumer

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
)

// Every configurable name reaches SQL only as a quoted identifier: hostile
// schema and prefix names create oddly named tables, never run SQL.
func TestHostileSchemaAndPrefixCannotInjectSQL(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	name := testdb.Name(t, "")
	canary := "canary_" + name[len(name)-10:]
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{canary}.Sanitize()+` (x int)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+pgx.Identifier{canary}.Sanitize()) })

	schema := `x"; DROP TABLE ` + canary + `; --`
	tables := idem.Tables{Schema: schema, Prefix: `p'";`}
	require.NoError(t, tables.Validate())
	_, err = migrate.Up(ctx, pool, tables)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+tables.QuotedSchema()+` CASCADE`) })

	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	c, err := New(Config{Name: `n'); DROP TABLE ` + canary + `; --`, Pool: pool, Tables: tables, Logger: testLogger()})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "bad" {
			return Permanent(errors.New(`'); DROP TABLE ` + canary + `; --`))
		}
		_, err := l.Record(ctx, tx, ledger.Effect{Type: `t'; --`, BusinessKey: m.ID, Target: `"; --`, Request: map[string]string{"q": `'"`}})
		return err
	})
	out, err := c.Process(ctx, []Message{{MessageID: `'); DROP TABLE x; --`, Body: []byte(`{}`)}, {MessageID: "bad", Body: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, "processed", out[0].Outcome.String())
	require.Equal(t, "dead_lettered", out[1].Outcome.String())

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{canary}.Sanitize()).Scan(&n))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("inbox")).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("ledger")).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("dead_letters")).Scan(&n))
	require.Equal(t, 1, n)
}
