package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// With an OrderingKey, a redelivered message (after a lost connection, a
// crash) runs alone, as a possible poison message, but in its key's place:
// no later message of its key commits before it.
func TestRedeliveriesKeepTheirKeysOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testbroker.NewProxy(t)
	e.declare(nil)
	s := e.tables.QuotedSchema()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE `+s+`.last_seq (account text PRIMARY KEY, seq int NOT NULL);
		CREATE TABLE `+s+`.violations (account text NOT NULL, seq int NOT NULL, after int NOT NULL)`)
	require.NoError(t, err)
	type event struct {
		Account string `json:"account"`
		Seq     int    `json:"seq"`
	}
	const accounts, events = 4, 100
	for seq := 1; seq <= events; seq++ {
		for a := range accounts {
			body, _ := json.Marshal(event{Account: fmt.Sprintf("a-%d", a), Seq: seq})
			e.publish(fmt.Sprintf("a-%d/%d", a, seq), string(body), nil)
		}
	}
	var calls atomic.Int64
	var stalling atomic.Bool
	stalling.Store(true)
	c := e.newConsumer(JSON(func(ctx context.Context, tx pgx.Tx, m *Message, ev event) error {
		// The first session's batches stall until the cut connection
		// cancels them: every delivery prefetched by then comes back
		// redelivered.
		calls.Add(1)
		if stalling.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		var last int
		if err := tx.QueryRow(ctx, `INSERT INTO `+s+`.last_seq VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET seq = EXCLUDED.seq
			RETURNING COALESCE((SELECT seq FROM `+s+`.last_seq WHERE account = $1), 0)`, ev.Account, ev.Seq).Scan(&last); err != nil {
			return err
		}
		if ev.Seq != last+1 {
			_, err := tx.Exec(ctx, `INSERT INTO `+s+`.violations VALUES ($1, $2, $3)`, ev.Account, ev.Seq, last)
			return err
		}
		return nil
	}), func(cfg *Config) {
		cfg.AMQPURL = proxy.URL()
		cfg.OrderingKey = func(m *Message) string {
			var ev event
			_ = json.Unmarshal(m.Body, &ev)
			return ev.Account
		}
		cfg.Workers = 4
		cfg.BatchMaxSize = 8
	})
	start(t, c)
	waitFor(t, 20*time.Second, "the first batches stalled", func() bool { return calls.Load() >= 4 })
	time.Sleep(200 * time.Millisecond) // the prefetch window fills
	stalling.Store(false)
	proxy.Sever()
	waitFor(t, 60*time.Second, "every event applied", func() bool { return c.Stats().Processed == accounts*events })
	require.Zero(t, e.count(`SELECT count(*) FROM `+s+`.violations`), "no event applied before an earlier one of its account")
	require.Positive(t, c.Stats().Reconnects)
}
