package replay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// A rebuild that starts after the live consumer's checkpoint would hand off
// past messages nobody processed: it is refused before anything runs.
func TestRebuildStartingAfterTheLiveCheckpointIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 10)...)
	live := e.consumer(nil, nil)
	e.runLive(live, 9)
	e.publish(msgs(10, 20)...)

	_, err := Run(ctx, live, Options{Mode: idem.Rebuild, From: Offset(15), Reset: e.reset})
	require.True(t, errors.Is(err, ErrInvalidOptions), "got %v", err)
	_, err = Run(ctx, live, Options{Mode: idem.Rebuild, From: Time(time.Now().Add(-time.Minute)), Reset: e.reset})
	require.True(t, errors.Is(err, ErrInvalidOptions), "got %v", err)
	sum, err := Run(ctx, live, Options{Mode: idem.Rebuild, From: First(), Reset: e.reset})
	require.NoError(t, err)
	require.EqualValues(t, 20, sum.Messages)
}

// A repair touches only what it selected: an invalid message in the range
// is neither dead-lettered again nor audited.
func TestRepairLeavesUnselectedInvalidMessagesAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 3)...)
	noID := msg(3)
	noID.MessageID = ""
	e.publish(noID)
	live := e.consumer(nil, nil)
	e.runLive(live, 3)
	dead := e.count(`SELECT count(*) FROM ` + e.tables.Table("dead_letters"))
	require.Equal(t, 1, dead, "the message without an id is dead-lettered live")

	sum, err := Run(ctx, live, Options{Mode: idem.Repair, Select: Selection{IDs: []string{"m-1"}}, Operator: "test", Reason: "test"})
	require.NoError(t, err)
	require.EqualValues(t, 1, sum.Processed)
	require.Equal(t, dead, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")), "no new dead letter")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_audit")), "one audit row: m-1")
}
