package replay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retention"
)

// forget makes retention delete the live consumer's inbox rows of offsets
// below n, as if they had been applied 40 days ago.
func (e *env) forget(n int64) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.tables.Table("inbox")+
		" SET received_at = now() - interval '40 days' WHERE consumer = 'test' AND stream_offset < $1", n)
	require.NoError(e.t, err)
	res, err := retention.Clean(context.Background(), retention.Config{Pool: e.pool, Tables: e.tables, OlderThan: 30 * 24 * time.Hour})
	require.NoError(e.t, err)
	require.Equal(e.t, n, res.Deleted("inbox"))
}

func TestNormalReplayRefusesToStartBelowTheInboxHorizon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 20)...)
	e.runLive(e.consumer(nil, nil), 19)
	e.forget(10)
	ctx := context.Background()

	// From the first record: offsets 0..9 were applied and forgotten.
	_, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal})
	require.ErrorIs(t, err, ErrBelowHorizon)
	require.ErrorContains(t, err, "start at 10 or later")
	require.Equal(t, 2, ExitCode(err))
	require.Zero(t, e.count("SELECT count(*) FROM "+e.tables.Table("replay_runs")), "a refused replay registers no run")
	for id, n := range e.applied() {
		require.Equal(t, 1, n, id)
	}
	// From an offset below the horizon, and from a time before it.
	_, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(9)})
	require.ErrorIs(t, err, ErrBelowHorizon)
	_, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Time(time.Now().Add(-time.Hour))})
	require.ErrorIs(t, err, ErrBelowHorizon)

	// From the horizon on, the inbox remembers everything: all duplicates.
	s, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(10)})
	require.NoError(t, err)
	require.Equal(t, int64(10), s.Duplicates)
	require.Zero(t, s.Processed)

	// A forensic replay only reads: it does not check the horizon.
	_, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Forensic})
	require.NotErrorIs(t, err, ErrBelowHorizon)

	// Told otherwise, the replay runs the forgotten messages again.
	s, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, AllowBelowHorizon: true})
	require.NoError(t, err)
	require.Equal(t, int64(10), s.Processed)
	require.Equal(t, int64(10), s.Duplicates)
	applied := e.applied()
	for i := range 20 {
		want := 1
		if i < 10 {
			want = 2
		}
		require.Equal(t, want, applied[msg(i).MessageID], msg(i).MessageID)
	}
}

func TestReplayWithoutRetentionHasNoHorizon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 5)...)
	e.runLive(e.consumer(nil, nil), 4)
	s, err := Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Normal})
	require.NoError(t, err)
	require.Equal(t, int64(5), s.Duplicates)
}
