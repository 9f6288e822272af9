package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/cpustat"
	"github.com/idemkit/idem/internal/streamio"
)

// benchMessages is the stream every benchmark iteration replays.
const benchMessages = 20000

// BenchmarkReplay compares, on the same stream of 20,000 messages: a raw
// stream read with a no-op handler (the baseline), a rebuild with a one-row
// upsert projection, a rebuild with a no-op handler (the framework's own
// cost: inbox claims, savepoints, checkpoint, commit), and a forensic
// replay of the projection (a one-row read per message). The upsert runs
// once with tx.Exec (a round trip per message), once through consumer.Defer
// (the batch's upserts pipelined before its commit), and once as a batch
// handler (consumer.HandleBatch: one set-based upsert per batch).
//
//	go test ./replay -run '^$' -bench Replay -benchtime 3x
func BenchmarkReplay(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	for i := 0; i < benchMessages; i += 5000 {
		var out []streamio.Outgoing
		for j := i; j < i+5000; j++ {
			out = append(out, streamio.Outgoing{MessageID: fmt.Sprintf("m-%d", j), Body: body(event{Key: fmt.Sprintf("k%d", j%1000), N: int64(j)})})
		}
		e.publish(out...)
	}
	s := e.tables.QuotedSchema()
	upsert := `INSERT INTO ` + s + `.totals AS t (key, sum) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET sum = EXCLUDED.sum`
	projection := func(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev event) error {
		if idem.ModeFrom(ctx) == idem.Forensic {
			var n int64
			err := tx.QueryRow(ctx, `SELECT sum FROM `+s+`.totals WHERE key = $1`, ev.Key).Scan(&n)
			if err == pgx.ErrNoRows {
				err = nil
			}
			return err
		}
		_, err := tx.Exec(ctx, upsert, ev.Key, ev.N)
		return err
	}
	c := e.consumer(nil, nil)
	c.Handle(consumer.JSON(projection))

	// measure runs one replay b.N times and reports messages per second and
	// the share of the cores' time the hypervisor gave to other virtual
	// machines meanwhile ("steal%": a run with a high steal is depressed
	// and noisy).
	measure := func(b *testing.B, replay func()) {
		cpu := cpustat.Read()
		start := time.Now()
		for range b.N {
			replay()
		}
		b.ReportMetric(float64(benchMessages)*float64(b.N)/time.Since(start).Seconds(), "msg/s")
		b.ReportMetric(cpustat.Read().StealSince(cpu), "steal%")
	}
	// rebuild measures full rebuild replays of the stream through c.
	rebuild := func(c *consumer.Consumer, reset func(context.Context, pgx.Tx) error) func(*testing.B) {
		return func(b *testing.B) {
			measure(b, func() {
				sum, err := Run(ctx, c, Options{Mode: idem.Rebuild, Reset: reset})
				require.NoError(b, err)
				require.EqualValues(b, benchMessages, sum.Processed)
			})
		}
	}
	b.Run("read_noop", func(b *testing.B) {
		measure(b, func() {
			n := 0
			err := e.se.Read(ctx, streamio.ReadSpec{Stream: e.stream}, func(_ context.Context, recs []streamio.Record) error {
				n += len(recs)
				return nil
			})
			require.NoError(b, err)
			require.Equal(b, benchMessages, n)
		})
	})
	b.Run("rebuild_upsert", rebuild(c, e.reset))
	deferred := e.consumer(nil, nil)
	deferred.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev event) error {
		return consumer.Defer(ctx, tx, upsert, ev.Key, ev.N) // pipelined with the batch's commit
	}))
	b.Run("rebuild_upsert_deferred", rebuild(deferred, e.reset))
	batched := e.consumer(nil, nil)
	batched.Handle(consumer.JSON(projection))
	upsertMany := `INSERT INTO ` + s + `.totals AS t (key, sum) SELECT * FROM unnest($1::text[], $2::bigint[])
		ON CONFLICT (key) DO UPDATE SET sum = EXCLUDED.sum`
	batched.HandleBatch(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		// The same projection, set-based: the last event per key wins, as
		// it does when the upserts run one by one.
		last := make(map[string]int64, len(msgs))
		var keys []string
		for _, m := range msgs {
			var ev event
			if err := json.Unmarshal(m.Body, &ev); err != nil {
				return err // the per-message handler dead-letters it
			}
			if _, seen := last[ev.Key]; !seen {
				keys = append(keys, ev.Key)
			}
			last[ev.Key] = ev.N
		}
		sums := make([]int64, len(keys))
		for i, k := range keys {
			sums[i] = last[k]
		}
		_, err := tx.Exec(ctx, upsertMany, keys, sums)
		return err
	})
	b.Run("rebuild_upsert_batch", rebuild(batched, e.reset))
	noop := e.consumer(nil, nil)
	noop.Handle(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	b.Run("rebuild_noop", rebuild(noop, nil))
	b.Run("forensic", func(b *testing.B) {
		measure(b, func() {
			sum, err := Run(ctx, c, Options{Mode: idem.Forensic})
			require.NoError(b, err)
			require.EqualValues(b, benchMessages, sum.Messages)
		})
	})
}
