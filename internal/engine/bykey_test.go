package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// keyed is item with an ordering key.
func keyed(id, key string, account int) *Item {
	it := item(id, account)
	it.Key = key
	return it
}

// In a queue with an ordering key, a failed message holds only its key:
// the later messages of its key in its batch are Held, unclaimed (they run
// later, as new messages), while the other keys' messages commit.
func TestAFailedItemHoldsOnlyItsKeysLaterItemsInItsBatch(t *testing.T) {
	t.Parallel()
	var f *fixture
	failA1 := true
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, m *idem.Message) error {
		if m.ID == "a1" && failA1 {
			return errors.New("a1 fails")
		}
		return f.updateAccount(ctx, tx, m)
	}, nil)
	ctx := context.Background()
	batch := []*Item{keyed("a1", "a", 1), keyed("b1", "b", 2), keyed("a2", "a", 1), keyed("b2", "b", 2), keyed("a3", "a", 1)}
	res := f.eng.Run(ctx, batch, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Retried, idem.Processed, idem.Held, idem.Processed, idem.Held}, outcomes(res))
	require.Equal(t, 0, f.balance(1))
	require.Equal(t, 2, f.balance(2))
	failA1 = false
	batch[0].Again()
	res = f.eng.Run(ctx, []*Item{batch[0], batch[2], batch[4]}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed, idem.Processed}, outcomes(res), "the held ones were not claimed")
	require.Equal(t, 2, batch[0].Attempt, "a1 ran at its second attempt, read from the attempts table")
	require.Equal(t, 3, f.balance(1))
}

// A split batch runs its second half's messages of a key that did not
// settle in the first half as Held: they wait for it.
func TestHoldBehindHoldsTheSecondHalfOfAKeyThatDidNotSettle(t *testing.T) {
	items := []*Item{keyed("a1", "a", 0), keyed("b1", "b", 0), keyed("a2", "a", 0), keyed("b2", "b", 0), keyed("c1", "c", 0)}
	first := []Result{{Outcome: idem.Unresolved}, {Outcome: idem.Processed}}
	fixed := make([]Result, len(items))
	fixed[4] = Result{Outcome: idem.DeadLettered}
	holdBehind(items, first, fixed)
	require.Equal(t, []idem.Outcome{0, 0, idem.Held, 0, idem.DeadLettered}, outcomes(fixed))
}
