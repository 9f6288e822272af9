package replay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/streamio"
)

// forget makes retention (the inbox's Cleanup, which `idem cleanup` runs)
// delete the live consumer's inbox rows first seen below offset n, as if
// every copy of them had come 40 days ago, and returns how many it deleted.
func (e *env) forget(n int64) int64 {
	e.t.Helper()
	deleted, err := e.tryForget(n)
	require.NoError(e.t, err)
	return deleted
}

// tryForget is forget, for a goroutine other than the test's.
func (e *env) tryForget(n int64) (int64, error) {
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.tables.Table("inbox")+
		` SET received_at = now() - interval '40 days', seen_at = CASE WHEN seen_at IS NOT NULL THEN now() - interval '40 days' END
		WHERE consumer = 'test' AND stream_offset < $1`, n)
	if err != nil {
		return 0, err
	}
	ib, err := inbox.New(inbox.Config{Tables: e.tables})
	if err != nil {
		return 0, err
	}
	res, err := ib.Cleanup(context.Background(), e.pool, inbox.CleanupOptions{OlderThan: 30 * 24 * time.Hour})
	return res.Deleted, err
}

func TestNormalReplayRefusesToStartBelowTheInboxHorizon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 20)...)
	e.runLive(e.consumer(nil, nil), 19)
	require.EqualValues(t, 10, e.forget(10))
	ctx := context.Background()

	// From the first record: offsets 0..9 were applied and forgotten.
	_, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	require.ErrorContains(t, err, "start at 10 or later")
	require.Zero(t, e.count("SELECT count(*) FROM "+e.tables.Table("replay_runs")), "a refused replay registers no run")
	for id, n := range e.applied() {
		require.Equal(t, 1, n, id)
	}
	// From an offset below the horizon, and from a time before it.
	_, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(9)})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	_, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Time(time.Now().Add(-time.Hour))})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)

	// From the horizon on, the inbox remembers everything: all duplicates.
	s, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(10)})
	require.NoError(t, err)
	require.Equal(t, int64(10), s.Duplicates)
	require.Zero(t, s.Processed)

	// A forensic replay only reads; it reports the forgotten messages as
	// such, not as never processed.
	s, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Forensic})
	require.NoError(t, err)
	require.Equal(t, int64(10), s.Forgotten)
	require.Zero(t, s.InboxNew)
	require.Equal(t, int64(10), s.InboxDuplicate)

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

// A stream holding each event twice (offsets 2i and 2i+1): the horizon
// counts the second copy, so a replay that starts at it is refused instead
// of applying the event a second time.
func TestNormalReplayRefusesTheSecondCopyOfAForgottenEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var twice []streamio.Outgoing
	for i := range 20 {
		twice = append(twice, msg(i), msg(i))
	}
	e.publish(twice...)
	e.runLive(e.consumer(nil, nil), 39)
	require.EqualValues(t, 10, e.forget(20), "events 0..9, first seen at offsets 0..18")
	ctx := context.Background()

	_, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(19), To: Offset(25)})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon, "offset 19 is the second copy of event 9, whose row is gone")
	require.ErrorContains(t, err, "start at 20 or later")
	s, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal, From: Offset(20), To: Offset(25)})
	require.NoError(t, err)
	require.Zero(t, s.Processed)
	require.Equal(t, int64(6), s.Duplicates)
	for id, n := range e.applied() {
		require.Equal(t, 1, n, id)
	}
}

// A normal replay stopped midway asks the horizon again when it resumes:
// retention may have made the consumer forget what it would read next.
func TestResumedNormalReplayIsRefusedWhenRetentionMovedTheHorizonPastIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 10)...)
	e.runLive(e.consumer(nil, nil), 9)
	e.publish(msgs(10, 20)...)
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied int
	h := &handler{e: e, onApply: func() {
		if applied++; applied == 3 {
			kill()
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Normal, RunID: "r1", BatchSize: 1})
	require.ErrorContains(t, err, "resume with run id r1")
	resumeAt := e.checkpoint(runScope("test", "r1")) + 1
	require.Less(t, resumeAt, int64(19))
	// Meanwhile the live worker applies the rest, and retention forgets it all.
	e.runLive(e.consumer(nil, nil), 19)
	require.EqualValues(t, 20, e.forget(20))

	_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Normal, RunID: "r1"})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	for id, n := range e.applied() {
		require.Equal(t, 1, n, id)
	}
}

// A clean-up that runs while a normal replay reads deletes rows further on
// in the replay's range: the replay, which checked the horizon when it
// started, stops at the first message it would claim as new below the
// horizon the clean-up moved, instead of applying the forgotten messages a
// second time.
func TestNormalReplayStopsWhenACleanUpOvertakesIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 10)...)
	e.runLive(e.consumer(nil, nil), 9)
	// Offset 0 lost its row without a horizon (as if never processed), so
	// the replay starts and applies it; while it does, retention forgets
	// offsets 1..9.
	_, err := e.pool.Exec(context.Background(), "DELETE FROM "+e.tables.Table("inbox")+` WHERE consumer = 'test' AND stream_offset = 0`)
	require.NoError(t, err)
	var forgotten int64
	var forgetErr error
	h := &handler{e: e, onApply: func() { // in the replay's handler, once
		if forgotten == 0 && forgetErr == nil {
			forgotten, forgetErr = e.tryForget(10)
		}
	}}

	_, err = Run(context.Background(), e.consumer(h, nil), Options{Mode: idem.Normal, BatchSize: 1})
	require.NoError(t, forgetErr)
	require.EqualValues(t, 9, forgotten)
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	require.ErrorContains(t, err, "during the run")
	for id, n := range e.applied() {
		require.Equal(t, 1, n, "%s applied again after its row was forgotten", id)
	}
}

// ageInbox makes every copy of the rows of scope first seen below offset n
// look 40 days old.
func (e *env) ageInbox(scope string, n int64) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.tables.Table("inbox")+
		` SET received_at = now() - interval '40 days', seen_at = CASE WHEN seen_at IS NOT NULL THEN now() - interval '40 days' END
		WHERE consumer = $1 AND stream_offset < $2`, scope, n)
	require.NoError(e.t, err)
}

// An online rebuild interrupted for longer than the retention keeps every
// row of its own inbox scope: retention spares it, the resumed rebuild
// swaps, and the live scope then knows every message the rebuilt tables
// hold, so a normal replay from just above the live horizon applies
// nothing twice.
func TestRetentionNeverTouchesAnInterruptedRebuildsScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.projection()
	e.publish(msgs(0, 500)...)
	e.runLive(e.consumer(&handler{e: e, proj: p}, nil), 499)
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied atomic.Int64
	h := &handler{e: e, proj: p, onApply: func() {
		if applied.Add(1) == 230 {
			kill()
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: "r1"})
	require.ErrorContains(t, err, "resume with run id r1")
	own := rebuildScope("test", "r1")
	kept := e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = $1`, own)
	require.Positive(t, kept)

	e.ageInbox(own, 500)
	e.ageInbox("test", 100)
	require.EqualValues(t, 100, e.forget(0), "the live rows of offsets 0..99 only")
	require.Equal(t, kept, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = $1`, own),
		"the rebuild's scope is held")

	s, err := Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil),
		Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: "r1"})
	require.NoError(t, err)
	require.True(t, s.Swapped)
	require.Equal(t, 400, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = 'test'`),
		"the live scope knows every message above its horizon")
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = $1`, own))
	held, err := inbox.New(inbox.Config{Tables: e.tables})
	require.NoError(t, err)
	isHeld, err := held.Held(context.Background(), e.pool, own)
	require.NoError(t, err)
	require.False(t, isHeld, "the swap released the scope")

	_, err = Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil), Options{Mode: idem.Normal, From: Offset(99)})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	r, err := Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil), Options{Mode: idem.Normal, From: Offset(100)})
	require.NoError(t, err)
	require.Zero(t, r.Processed)
	require.Equal(t, int64(400), r.Duplicates)
	e.requireAppliedOnce(500, s.Handoff)
}

// A rebuild whose own scope lost rows anyway (deleted before scopes were
// held) no longer knows every message it applied: it refuses to resume,
// naming the horizon, and can be abandoned.
func TestRebuildWhoseScopeLostRowsRefusesToResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.projection()
	e.publish(msgs(0, 300)...)
	e.runLive(e.consumer(&handler{e: e, proj: p}, nil), 299)
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied atomic.Int64
	h := &handler{e: e, proj: p, onApply: func() {
		if applied.Add(1) == 120 {
			kill()
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: "r1"})
	require.Error(t, err)
	own := rebuildScope("test", "r1")
	_, err = e.pool.Exec(context.Background(), `DELETE FROM `+e.tables.Table("inbox_holds")+` WHERE consumer = $1`, own)
	require.NoError(t, err)
	e.ageInbox(own, 50)
	require.Positive(t, e.forget(0))

	_, err = Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil),
		Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: "r1"})
	require.ErrorIs(t, err, inbox.ErrBeyondHorizon)
	require.ErrorContains(t, err, "abandon it")
	require.NoError(t, Abandon(context.Background(), e.pool, e.tables, "r1"))
	for id, n := range e.applied() {
		require.Equal(t, 1, n, id)
	}
}
