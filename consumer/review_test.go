package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// Dead letters keep whatever bytes a producer sent in ids and routing
// headers; none of it may fail the batch's dead-letter insert.
func TestDeadLettersWithUnstorableBytesDoNotFailTheBatch(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := New(Config{Name: "bytes", Pool: pool, Tables: tables, Logger: testLogger(), MaxIDBytes: 100})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error { return Permanent(errors.New("no")) })
	out, err := c.Process(context.Background(), []Message{
		{MessageID: strings.Repeat("a", 63) + "é" + strings.Repeat("b", 60), Body: []byte(`1`)}, // cut mid-rune
		{MessageID: strings.Repeat("\x00", 120), Body: []byte(`2`)},
		{MessageID: "m3", Body: []byte(`3`), Exchange: "\xff", RoutingKey: "k\x00"},
	})
	require.NoError(t, err)
	for _, o := range out {
		require.Equal(t, "dead_lettered", o.Outcome.String())
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+tables.Table("dead_letters")).Scan(&n))
	require.Equal(t, 3, n)
}

// A large batch is prepared on several goroutines; every message keeps its
// place, its id, hash and business key, and the invalid ones are still
// dead-lettered with their reason.
func TestLargeBatchIsPreparedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := New(Config{Name: "large", Pool: e.pool, Tables: e.tables, Logger: testLogger(),
		BusinessKey: func(m *Message) (string, error) { return "key-" + string(m.Body), nil }})
	require.NoError(t, err)
	c.Handle(e.effectHandler())
	var ins []Message
	for i := range 1000 { // large enough to be prepared on several goroutines
		id := fmt.Sprintf("m-%d", i)
		if i%100 == 7 {
			id = "" // missing id: dead-lettered
		}
		ins = append(ins, Message{MessageID: id, Body: []byte(strconv.Itoa(i))})
	}
	out, err := c.Process(context.Background(), ins)
	require.NoError(t, err)
	require.Len(t, out, len(ins))
	for i, o := range out {
		if i%100 == 7 {
			require.Equal(t, "dead_lettered", o.Outcome.String(), "message %d", i)
			require.Equal(t, deadletters.ReasonMissingMessageID, o.Reason)
			continue
		}
		require.Equal(t, "processed", o.Outcome.String(), "message %d", i)
		require.Equal(t, fmt.Sprintf("m-%d", i), o.Message.ID)
		require.Equal(t, "key-"+strconv.Itoa(i), o.Message.BusinessKey)
		require.Equal(t, idem.HashBytes([]byte(strconv.Itoa(i))), o.Message.Hash)
	}
}
