package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
)

// ReceivedAt is stamped when the runtime takes the delivery from the
// broker: after it was published, before the handler runs.
func TestReceivedAtIsWhenTheRuntimeTookTheDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var mu sync.Mutex
	var received, handled time.Time
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		mu.Lock()
		defer mu.Unlock()
		received, handled = m.ReceivedAt, time.Now()
		return nil
	}, nil)
	start(t, c)
	published := time.Now()
	e.publish("m-1", `{}`, nil)
	waitFor(t, 20*time.Second, "1 delivery settled", func() bool { return settled(c) == 1 })
	mu.Lock()
	defer mu.Unlock()
	require.False(t, received.Before(published), "received %v before published %v", received, published)
	require.False(t, handled.Before(received), "handled %v before received %v", handled, received)
}

// Process keeps a message's ReceivedAt and stamps the call's time on the
// ones without.
func TestProcessKeepsOrStampsReceivedAt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got []time.Time
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		got = append(got, m.ReceivedAt)
		return nil
	}, nil)
	earlier := time.Now().Add(-time.Hour)
	before := time.Now()
	_, err := c.Process(context.Background(), []Message{
		{MessageID: "m-1", Body: []byte(`{}`), ReceivedAt: earlier},
		{MessageID: "m-2", Body: []byte(`{}`)},
	})
	after := time.Now()
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.True(t, got[0].Equal(earlier))
	require.False(t, got[1].Before(before) || got[1].After(after), "stamped %v, want within [%v, %v]", got[1], before, after)
}

// The runtime works in the query exec modes used behind PgBouncer (exec,
// simple protocol), where parameters travel without their PostgreSQL type:
// claims, deferred writes, dead-letter rows, and a second run that finds
// every message a duplicate.
func TestBatchRunsInThePgBouncerQueryExecModes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := testdb.WithExecMode(t, e.pool, mode)
			insert := `INSERT INTO ` + e.tables.QuotedSchema() + `.effects (message_id, note) VALUES ($1, $2)`
			c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if string(m.Body) == "refuse" {
					return Permanent(errors.New("refused"))
				}
				return Defer(ctx, tx, insert, m.ID, mode.String())
			}, func(cfg *Config) { cfg.Pool, cfg.Name = pool, "test-"+mode.String() })
			msgs := []Message{
				{MessageID: "a", Body: []byte("ok")},
				{MessageID: "b", Body: []byte("ok")},
				{MessageID: "a", Body: []byte("ok")},
				{MessageID: "c", Body: []byte("refuse")},
			}
			results := func() []string {
				out, err := c.Process(t.Context(), msgs)
				require.NoError(t, err)
				var r []string
				for _, o := range out {
					r = append(r, o.Outcome.String())
				}
				return r
			}
			require.Equal(t, []string{"processed", "processed", "duplicate", "dead_lettered"}, results())
			require.Equal(t, []string{"duplicate", "duplicate", "duplicate", "dead_lettered"}, results())
			require.Equal(t, 2, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.effects WHERE note = '`+mode.String()+`'`))
		})
	}
}
