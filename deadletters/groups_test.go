package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// waiting inserts a dead-letter row of consumer for reason, committed
// ago before now, and redriven when redriven is set.
func (e *env) waiting(consumer, reason string, ago time.Duration, redriven bool) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.tables.Table("dead_letters")+
		` (consumer, message_id, payload_hash, reason, dead_lettered_at, redriven_at)
		VALUES ($1, gen_random_uuid()::text, sha256('x'), $2, now() - $3::interval, CASE WHEN $4 THEN now() END)`,
		consumer, reason, ago.String(), redriven)
	require.NoError(e.t, err)
}

func TestGroupsCountTheWaitingDeadLettersWithTheirOldestAndNewest(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	e := &env{t: t, pool: pool, tables: tables}
	ctx := context.Background()
	for _, ago := range []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour} {
		e.waiting("billing", "max_attempts", ago, false)
	}
	e.waiting("billing", "payload_conflict", 30*time.Minute, false)
	e.waiting("shipping", "max_attempts", 5*time.Hour, false)
	e.waiting("shipping", "max_attempts", time.Minute, false)
	e.waiting("shipping", "max_attempts", 9*time.Hour, true) // redriven: no longer waits
	at := func(g deadletters.Group) []any {
		return []any{g.Consumer, g.Reason, g.Count, g.Capped, time.Since(g.Oldest).Round(time.Hour), time.Since(g.Newest).Round(time.Hour)}
	}

	groups, more, err := deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{})
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, groups, 2)
	require.Equal(t, []any{"", "max_attempts", int64(5), false, 5 * time.Hour, time.Duration(0)}, at(groups[0]))
	require.Equal(t, []any{"", "payload_conflict", int64(1), false, time.Hour, time.Hour}, at(groups[1]))

	groups, more, err = deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{By: deadletters.ByConsumerReason})
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, groups, 3)
	require.Equal(t, []any{"billing", "max_attempts", int64(3), false, 3 * time.Hour, time.Hour}, at(groups[0]))
	require.Equal(t, []any{"billing", "payload_conflict", int64(1), false, time.Hour, time.Hour}, at(groups[1]))
	require.Equal(t, []any{"shipping", "max_attempts", int64(2), false, 5 * time.Hour, time.Duration(0)}, at(groups[2]))

	groups, more, err = deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{Consumer: "shipping"})
	require.NoError(t, err)
	require.False(t, more)
	require.Equal(t, [][]any{{"shipping", "max_attempts", int64(2), false, 5 * time.Hour, time.Duration(0)}},
		[][]any{at(groups[0])}, "the reasons of one consumer")

	groups, more, err = deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{By: deadletters.ByConsumerReason, Limit: 2, CountCap: 2})
	require.NoError(t, err)
	require.True(t, more, "a third group follows")
	require.Len(t, groups, 2)
	require.Equal(t, []any{"billing", "max_attempts", int64(2), true, 3 * time.Hour, time.Hour}, at(groups[0]), "more than the cap")

	_, _, err = deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{By: "message_id"})
	require.Error(t, err)
}

func TestListPagesNewestFirstWithoutRepeatsOrGaps(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	e := &env{t: t, pool: pool, tables: tables}
	ctx := context.Background()
	for range 5 {
		e.waiting("billing", "max_attempts", time.Minute, false)
	}
	e.waiting("shipping", "max_attempts", time.Minute, false)
	var ids []int64
	f := deadletters.Filter{Consumer: "billing", Limit: 2}
	for {
		page, err := deadletters.List(ctx, pool, tables, f)
		require.NoError(t, err)
		for _, r := range page {
			ids = append(ids, r.ID)
		}
		if len(page) < f.Limit {
			break
		}
		f.Before = page[len(page)-1].ID
	}
	require.Len(t, ids, 5)
	for i := 1; i < len(ids); i++ {
		require.Less(t, ids[i], ids[i-1], "newest first, none twice")
	}
}
