package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestBatchHandlerWritesTheBatchOnceAndFallsBackToMessagesOnFailure(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+tables.QuotedSchema()+`.effects (message_id text NOT NULL)`)
	require.NoError(t, err)
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.effects (message_id) SELECT unnest($1::text[])`
	c, err := New(Config{Name: "batch", Pool: pool, Tables: tables, Logger: testLogger()})
	require.NoError(t, err)
	var batches, singles atomic.Int32
	c.HandleBatch(func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		batches.Add(1)
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			if string(m.Body) == "bad" {
				return errors.New("one message of the batch is bad")
			}
			ids[i] = m.ID
		}
		_, err := tx.Exec(ctx, insert, ids)
		return err
	})
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		singles.Add(1)
		if string(m.Body) == "bad" {
			return Permanent(errors.New("bad"))
		}
		_, err := tx.Exec(ctx, insert, []string{m.ID})
		return err
	})
	count := func() map[string]int {
		rows, err := pool.Query(ctx, `SELECT message_id, count(*)::int FROM `+tables.QuotedSchema()+`.effects GROUP BY 1`)
		require.NoError(t, err)
		out := map[string]int{}
		var id string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
		require.NoError(t, err)
		return out
	}

	out, err := c.Process(ctx, []Message{{MessageID: "a", Body: []byte("ok")}, {MessageID: "b", Body: []byte("ok")},
		{MessageID: "a", Body: []byte("ok")}, {MessageID: "c", Body: []byte("ok")}})
	require.NoError(t, err)
	require.Equal(t, []string{"processed", "processed", "duplicate", "processed"},
		[]string{out[0].Outcome.String(), out[1].Outcome.String(), out[2].Outcome.String(), out[3].Outcome.String()})
	require.EqualValues(t, 1, batches.Load(), "one call for the batch")
	require.Zero(t, singles.Load())
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, count())

	out, err = c.Process(ctx, []Message{{MessageID: "d", Body: []byte("ok")}, {MessageID: "e", Body: []byte("bad")},
		{MessageID: "f", Body: []byte("ok")}})
	require.NoError(t, err)
	require.Equal(t, []string{"processed", "dead_lettered", "processed"}, []string{out[0].Outcome.String(), out[1].Outcome.String(), out[2].Outcome.String()})
	require.EqualValues(t, 2, batches.Load())
	require.EqualValues(t, 3, singles.Load(), "the failed batch runs again message by message")
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "f": 1}, count())
}
