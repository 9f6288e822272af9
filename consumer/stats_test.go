package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The fields of Stats that name an outcome are the ByOutcome tally, so no
// snapshot shows them apart, even one taken while batches are being
// counted.
func TestStatsNamedOutcomesAgreeWithByOutcomeInEverySnapshot(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	c, err := New(Config{Name: "stats", Pool: pool, Tables: tables, Logger: testLogger()})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		switch string(m.Body) {
		case "bad":
			return Permanent(errors.New("bad"))
		case "later":
			return errors.New("later")
		}
		return nil
	})

	const workers, rounds = 4, 60
	var done atomic.Bool
	var snapshots atomic.Int64
	var watch sync.WaitGroup
	watch.Go(func() {
		for !done.Load() {
			s := c.Stats()
			snapshots.Add(1)
			named := [...]int64{s.Processed, s.Duplicates, s.DeadLettered, s.Retried, s.Unresolved}
			tally := [...]int64{s.ByOutcome[idem.Processed], s.ByOutcome[idem.Duplicate], s.ByOutcome[idem.DeadLettered],
				s.ByOutcome[idem.Retried], s.ByOutcome[idem.Unresolved]}
			if named != tally {
				t.Errorf("named fields %v, ByOutcome %v", named, tally)
				return
			}
		}
	})
	var work sync.WaitGroup
	for w := range workers {
		work.Go(func() {
			for i := range rounds {
				id := fmt.Sprintf("%d-%d", w, i)
				_, err := c.Process(ctx, []Message{{MessageID: id, Body: []byte("ok")}, {MessageID: id, Body: []byte("ok")},
					{MessageID: id + "-bad", Body: []byte("bad")}, {MessageID: id + "-later", Body: []byte("later")}})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	work.Wait()
	done.Store(true)
	watch.Wait()

	s := c.Stats()
	n := int64(workers * rounds)
	require.Equal(t, [...]int64{n, n, n, n}, [...]int64{s.Processed, s.Duplicates, s.DeadLettered, s.Retried})
	require.Positive(t, snapshots.Load())
}
