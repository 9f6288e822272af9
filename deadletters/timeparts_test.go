package deadletters_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/timeparts"
	"github.com/idemkit/idem/migrate"
)

// With `idem migrate --partition-width`, an empty dead-letter table is
// laid out in time partitions: a consumer writes its dead letters there,
// they are counted, listed, grouped and redriven as in the plain table,
// and DeleteBefore drops the partitions that lie wholly before its cutoff
// whole and deletes the older rows of the others one by one, keeping every
// younger row.
func TestDeadLettersInTimePartitionsAreWrittenReadRedrivenAndDroppedWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	res, err := migrate.UpWith(ctx, e.pool, e.tables, migrate.Options{PartitionWidth: time.Minute})
	require.NoError(t, err)
	require.Empty(t, res.KeptPlain)
	require.Equal(t, "p", e.relkind("dead_letters"), "the dead-letter table is partitioned")

	c, err := consumer.New(consumer.Config{Name: "billing", Pool: e.pool, Tables: e.tables, Logger: quiet()})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.DeadLetter("invalid_amount", errors.New("the amount is negative"))
	})
	var batch []consumer.Message
	for _, id := range []string{"old-1", "old-2", "edge-old", "edge-young", "young"} {
		batch = append(batch, consumer.Message{MessageID: id, Body: []byte(`{"id":"` + id + `"}`)})
	}
	results, err := c.Process(ctx, batch)
	require.NoError(t, err)
	for _, r := range results {
		require.Equal(t, idem.DeadLettered, r.Outcome, "%s: %v", r.Message.ID, r.Err)
	}
	n, err := deadletters.Count(ctx, e.pool, e.tables, "billing")
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	recs, err := deadletters.List(ctx, e.pool, e.tables, deadletters.Filter{Consumer: "billing", Reason: "invalid_amount"})
	require.NoError(t, err)
	require.Len(t, recs, 5)
	groups, _, err := deadletters.Groups(ctx, e.pool, e.tables, deadletters.GroupFilter{})
	require.NoError(t, err)
	require.Len(t, groups, 1)
	require.EqualValues(t, 5, groups[0].Count)

	// Redriving one marks its own row.
	e.declare(nil)
	e.deadLetter("billing", "redriven", "max_attempts")
	o := e.options()
	o.MessageID, o.Operator = "redriven", "alice"
	rr, err := deadletters.Redrive(ctx, o)
	require.NoError(t, err)
	require.Equal(t, 1, rr.Marked)
	require.Equal(t, map[string]string{"redriven": "alice"}, e.redriven())

	// Age the rows: the old ones three hours (they move to the default
	// partition, which no partition of theirs covers yet), the edge ones
	// to either side of the cutoff, inside one minute's partition.
	cutoff := time.Now().Add(-time.Hour).Truncate(time.Minute).Add(30 * time.Second)
	age := map[string]time.Time{"old-1": cutoff.Add(-3 * time.Hour), "old-2": cutoff.Add(-3*time.Hour + time.Minute),
		"edge-old": cutoff.Add(-time.Second), "edge-young": cutoff.Add(time.Second)}
	for id, at := range age {
		_, err := e.pool.Exec(ctx, "UPDATE "+e.tables.Table("dead_letters")+" SET dead_lettered_at = $1 WHERE message_id = $2", at, id)
		require.NoError(t, err)
	}
	older := func() (n int) {
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname <> $2 AND c.relname < $3`,
			e.tables.Table("dead_letters"), e.tables.WithDefaults().Prefix+"dead_letters_default",
			e.tables.WithDefaults().Prefix+"dead_letters_p"+strconv.FormatInt(cutoff.Truncate(time.Minute).Unix(), 10)).Scan(&n))
		return n
	}
	// What retention does first: the old rows get partitions of their own.
	made, err := timeparts.New(e.tables, "dead_letters", "dead_lettered_at").Ensure(ctx, e.pool, 0)
	require.NoError(t, err)
	require.Equal(t, 3, made, "the partitions of old-1, old-2 and the edge rows")
	require.Equal(t, 2, older())
	deleted, err := deadletters.DeleteBefore(ctx, e.pool, e.tables, cutoff, 100)
	require.NoError(t, err)
	require.EqualValues(t, 3, deleted, "old-1, old-2 and edge-old")
	recs, err = deadletters.List(ctx, e.pool, e.tables, deadletters.Filter{})
	require.NoError(t, err)
	var left []string
	for _, r := range recs {
		left = append(left, r.MessageID)
	}
	require.ElementsMatch(t, []string{"edge-young", "young", "redriven"}, left)
	require.Zero(t, older(), "every partition wholly before the cutoff is dropped")
}

// A dead-letter table that holds rows keeps the plain layout: migrate says
// so, and DeleteBefore cleans it row by row as before.
func TestMigrateKeepsADeadLetterTableThatHoldsRowsPlain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.declare(nil)
	e.deadLetter("billing", "m-1", "max_attempts")
	res, err := migrate.UpWith(ctx, e.pool, e.tables, migrate.Options{PartitionWidth: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"dead_letters"}, res.KeptPlain)
	require.Equal(t, "r", e.relkind("dead_letters"))
	n, err := deadletters.DeleteBefore(ctx, e.pool, e.tables, time.Now().Add(time.Minute), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// relkind is the kind of the table name of e's schema: "r" a plain table,
// "p" a partitioned one.
func (e *env) relkind(name string) string {
	e.t.Helper()
	var kind string
	require.NoError(e.t, e.pool.QueryRow(context.Background(), "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)",
		e.tables.Table(name)).Scan(&kind))
	return kind
}
