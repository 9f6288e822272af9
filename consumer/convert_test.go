package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/migrate"
)

// Two workers of one consumer keep processing batches while `idem migrate
// --partition-width` (migrate.UpWith) converts their inbox, which holds
// history, to the partitioned layout: no batch fails but for a lock wait
// past the consumer's lock timeout, which runs again, every message is
// applied once (the ones both workers receive at once too), and the copies
// of the history stay duplicates.
func TestWorkersRunThroughAnOnlineConversionOfTheirInbox(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := t.Context()
	tables := idem.Tables{Schema: testdb.Name(t, "conv")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+tables.QuotedSchema()+" CASCADE")
	})
	_, err := migrate.Up(ctx, pool, tables)
	require.NoError(t, err)
	effects := tables.Table("effects")
	_, err = pool.Exec(ctx, "CREATE TABLE "+effects+" (id text NOT NULL)")
	require.NoError(t, err)

	workers := make([]*Consumer, 2)
	for i := range workers {
		c, err := New(Config{Name: "orders", Pool: pool, Tables: tables, Logger: testLogger()})
		require.NoError(t, err)
		c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (id) VALUES ($1)", m.ID)
			return err
		})
		workers[i] = c
	}
	msg := func(id string) Message { return Message{MessageID: id, Body: []byte(`{"id":"` + id + `"}`)} }
	const history = 2000
	for b := range history / 100 {
		batch := make([]Message, 100)
		for i := range batch {
			batch[i] = msg(fmt.Sprintf("old-%d", b*100+i))
		}
		_, err := workers[0].Process(ctx, batch)
		require.NoError(t, err)
	}
	// More history, of other consumers.
	_, err = pool.Exec(ctx, `INSERT INTO `+tables.Table("inbox")+` (consumer, message_id, payload_hash, received_at)
SELECT 'other', 'm-' || i, sha256(int8send(i)), now() - interval '2 days' FROM generate_series(1, 50000) AS i`)
	require.NoError(t, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rounds, retried atomic.Int64
	errs := make(chan error, len(workers))
	for w, c := range workers {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				batch := []Message{msg(fmt.Sprintf("shared-%d", k)), msg(fmt.Sprintf("old-%d", (k*131+w)%history))}
				for j := range 4 {
					batch = append(batch, msg(fmt.Sprintf("new-%d-%d-%d", w, k, j)))
				}
				res, err := c.Process(ctx, batch)
				// A claim queued behind a step of the conversion waits at
				// most the consumer's lock timeout: the batch fails as a
				// whole and, as Process says, runs again.
				for try := 1; isLockTimeout(err) && try < 20; try++ {
					retried.Add(1)
					time.Sleep(10 * time.Millisecond)
					res, err = c.Process(ctx, batch)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d, batch %d: %w", w, k, err)
					return
				}
				for _, r := range res {
					if r.Outcome != idem.Processed && r.Outcome != idem.Duplicate {
						errs <- fmt.Errorf("worker %d, batch %d: %s: %v (%v)", w, k, r.Message.ID, r.Outcome, r.Err)
						return
					}
				}
				if res[1].Outcome != idem.Duplicate {
					errs <- fmt.Errorf("worker %d, batch %d: a copy of the history was %v", w, k, res[1].Outcome)
					return
				}
				rounds.Add(1)
			}
		})
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	waitRounds := func(n int64) {
		deadline := time.Now().Add(time.Minute)
		for start := rounds.Load(); rounds.Load() < start+n; time.Sleep(10 * time.Millisecond) {
			select {
			case err := <-errs:
				require.NoError(t, err)
			default:
			}
			require.True(t, time.Now().Before(deadline), "the workers made no progress")
		}
	}
	waitRounds(30)
	_, err = migrate.UpWith(ctx, pool, tables, migrate.Options{PartitionWidth: time.Minute})
	require.NoError(t, err)
	waitRounds(30)
	halt()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	var kind string
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", tables.Table("inbox")).Scan(&kind))
	require.Equal(t, "p", kind, "the inbox is partitioned")
	var twice, applied int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n > 1), count(*)
FROM (SELECT id, count(*) AS n FROM `+effects+` GROUP BY id) AS e`).Scan(&twice, &applied))
	require.Zero(t, twice, "a message applied twice")
	t.Logf("%d rounds, %d messages applied once each, %d batches run again after a lock timeout", rounds.Load(), applied, retried.Load())
}

// isLockTimeout reports a lock wait past lock_timeout (55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
