package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testdb"
)

// A stream batch that keeps failing at batch level is split; the halves
// that commit must not move the checkpoint past a message of a half that
// did not, or that message would be skipped for good on restart.
func TestSplitStreamBatchNeverCheckpointsPastAnUnsettledMessage(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := New(Config{Name: "split", Pool: pool, Tables: tables, Stream: "s", Logger: testLogger(), BatchRetries: 2})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Offset == 1 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return nil
	})
	var recs []streamio.Record
	for i := int64(0); i < 4; i++ {
		recs = append(recs, streamio.Record{Offset: i, MessageID: fmt.Sprintf("m%d", i), Body: []byte(`{}`)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = c.streamBatch(ctx, ctx, recs)
	require.Error(t, err, "offset 1 never settles")
	last, ok, err := Checkpoint(ctx, pool, tables, "split", "s")
	require.NoError(t, err)
	if ok {
		require.Less(t, last, int64(1), "the checkpoint passed offset 1, which never committed")
	}
}

// Dead letters keep whatever bytes a producer sent in ids and routing
// headers; none of it may fail the batch's dead-letter insert.
func TestDeadLettersWithUnstorableBytesDoNotFailTheBatch(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := New(Config{Name: "bytes", Pool: pool, Tables: tables, Logger: testLogger(), MaxIDBytes: 100})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error { return Permanent(errors.New("no")) })
	out, err := c.Process(context.Background(), []Incoming{
		{MessageID: strings.Repeat("a", 63) + "é" + strings.Repeat("b", 60), Body: []byte(`1`)}, // cut mid-rune
		{MessageID: strings.Repeat("\x00", 120), Body: []byte(`2`)},
		{MessageID: "m3", Body: []byte(`3`), Exchange: "\xff", RoutingKey: "k\x00"},
	})
	require.NoError(t, err)
	for _, o := range out {
		require.Equal(t, "dead_lettered", o.Result)
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+tables.Table("dead_letters")).Scan(&n))
	require.Equal(t, 3, n)
}

// A repair re-runs a processed message once even when the batch holds two
// copies of it.
func TestRerunRunsEachMessageOncePerBatch(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := New(Config{Name: "rerun", Pool: pool, Tables: tables, Logger: testLogger()})
	require.NoError(t, err)
	var runs atomic.Int32
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error { runs.Add(1); return nil })
	m := Incoming{MessageID: "m", Body: []byte(`{}`)}
	_, err = c.Process(context.Background(), []Incoming{m})
	require.NoError(t, err)
	out, err := c.ProcessWith(context.Background(), []Incoming{m, m}, BatchOptions{Rerun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"processed", "duplicate"}, []string{out[0].Result, out[1].Result})
	require.EqualValues(t, 2, runs.Load())
}

// Batches claim with a plain INSERT until one meets a message the inbox
// holds; that batch runs again with ClaimBatch, and its duplicates and
// conflicts are decided as always, each message's effect applied once.
func TestBatchThatMeetsAClaimedMessageFallsBackToClaimBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := New(Config{Name: "fallback", Pool: e.pool, Tables: e.tables, Logger: testLogger()})
	require.NoError(t, err)
	c.Handle(e.effectHandler())
	ctx := context.Background()
	out, err := c.Process(ctx, []Incoming{{MessageID: "a", Body: []byte(`1`)}})
	require.NoError(t, err)
	require.Equal(t, "processed", out[0].Result)
	require.Zero(t, c.classicClaims.Load(), "a batch of new messages keeps the plain INSERT")

	out, err = c.Process(ctx, []Incoming{
		{MessageID: "b", Body: []byte(`2`)},
		{MessageID: "a", Body: []byte(`1`)}, // processed before: duplicate
		{MessageID: "a", Body: []byte(`9`)}, // its id with another payload: conflict
		{MessageID: "c", Body: []byte(`3`)},
	})
	require.NoError(t, err)
	var results []string
	for _, o := range out {
		results = append(results, o.Result+"/"+o.Inbox)
	}
	require.Equal(t, []string{"processed/new", "duplicate/duplicate", "dead_lettered/conflict", "processed/new"}, results)
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, e.effects())
	require.EqualValues(t, classicClaimBatches, c.classicClaims.Load(), "the next batches claim with ClaimBatch")
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
	var ins []Incoming
	for i := range 3 * prepareChunk {
		id := fmt.Sprintf("m-%d", i)
		if i%100 == 7 {
			id = "" // missing id: dead-lettered
		}
		ins = append(ins, Incoming{MessageID: id, Body: []byte(strconv.Itoa(i))})
	}
	out, err := c.Process(context.Background(), ins)
	require.NoError(t, err)
	require.Len(t, out, len(ins))
	for i, o := range out {
		if i%100 == 7 {
			require.Equal(t, "dead_lettered", o.Result, "message %d", i)
			require.Equal(t, ReasonMissingMessageID, o.Reason)
			continue
		}
		require.Equal(t, "processed", o.Result, "message %d", i)
		require.Equal(t, fmt.Sprintf("m-%d", i), o.MessageID)
		require.Equal(t, "key-"+strconv.Itoa(i), o.BusinessKey)
		require.Equal(t, idem.HashBytes([]byte(strconv.Itoa(i))), o.Hash)
	}
}
