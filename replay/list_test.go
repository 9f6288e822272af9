package replay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/streamio"
)

func TestListRunsShowsEachRunNewestFirstWithItsAuditCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 10)...)
	c := e.consumer(nil, nil)
	normal, err := Run(ctx, c, Options{Mode: idem.Normal})
	require.NoError(t, err)
	repair, err := Run(ctx, c, Options{Mode: idem.Repair, Select: Selection{IDs: []string{"m-2", "m-3"}},
		Operator: "alice", Reason: "INC-7"})
	require.NoError(t, err)

	runs, err := ListRuns(ctx, e.pool, e.tables, RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	r := runs[0]
	require.Equal(t, repair.RunID, r.ID)
	require.Equal(t, idem.Repair, r.Mode)
	require.Equal(t, "test", r.Consumer)
	require.Equal(t, e.stream, r.Stream)
	require.Equal(t, "first", r.From)
	require.Equal(t, "tail", r.To)
	require.Equal(t, int64(9), r.End)
	require.Equal(t, "alice", r.Operator)
	require.Equal(t, "INC-7", r.Reason)
	require.True(t, r.Finished)
	require.False(t, r.FinishedAt.Before(r.StartedAt))
	require.Equal(t, int64(2), r.Audited)
	require.Zero(t, r.DeadLettered)
	require.Equal(t, normal.RunID, runs[1].ID)
	require.Zero(t, runs[1].Audited, "a normal replay writes no audit rows")

	runs, err = ListRuns(ctx, e.pool, e.tables, RunFilter{Consumer: "someone-else"})
	require.NoError(t, err)
	require.Empty(t, runs)
	runs, err = ListRuns(ctx, e.pool, e.tables, RunFilter{Limit: 1})
	require.NoError(t, err)
	require.Len(t, runs, 1)
}

func TestListRunsCountsTheDeadLettersOfARebuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 5)...)
	e.publish(streamio.Outgoing{MessageID: "m-reject", Body: body(event{Key: "k1", Reject: true})})
	c := e.consumer(nil, nil)
	e.runLive(c, 5) // the live consumer has read it all: the rebuild has nothing to catch up
	s, err := Run(ctx, c, Options{Mode: idem.Rebuild, Reset: e.reset})
	require.NoError(t, err)
	require.EqualValues(t, 1, s.DeadLettered)

	runs, err := ListRuns(ctx, e.pool, e.tables, RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, idem.Rebuild, runs[0].Mode)
	require.Equal(t, int64(1), runs[0].DeadLettered, "what the run's summary said")
}
