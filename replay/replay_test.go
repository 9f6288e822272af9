package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/projection"
)

func TestReplayStopsByItselfAtTheEndFixedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 100)...)
	t1 := time.Now()
	e.publish(msgs(100, 150)...)
	t2 := time.Now()

	// Messages appended while the replay runs are not replayed.
	var once sync.Once
	h := &handler{e: e, onApply: func() { once.Do(func() { e.publish(msgs(150, 200)...) }) }}
	s, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Normal})
	require.NoError(t, err)
	require.EqualValues(t, 149, s.End)
	require.EqualValues(t, 0, s.First)
	require.EqualValues(t, 149, s.Last)
	require.EqualValues(t, 150, s.Processed)

	c := e.consumer(nil, nil)
	s, err = Run(ctx, c, Options{Mode: idem.Forensic, From: Offset(120)})
	require.NoError(t, err)
	require.EqualValues(t, 120, s.First)
	require.EqualValues(t, 199, s.Last)
	require.EqualValues(t, 80, s.Messages)

	s, err = Run(ctx, c, Options{Mode: idem.Forensic, From: Time(t1), To: Time(t2)})
	require.NoError(t, err)
	require.EqualValues(t, 100, s.First, "the first record created at or after the start time")
	require.EqualValues(t, 149, s.Last, "the last record created at or before the end time")
	require.EqualValues(t, 50, s.Messages)

	s, err = Run(ctx, c, Options{Mode: idem.Forensic, From: Offset(10), To: Offset(19)})
	require.NoError(t, err)
	require.Equal(t, [3]int64{10, 19, 10}, [3]int64{s.First, s.Last, s.Messages})
}

func TestRebuildReproducesTheLiveProjectionAndDispatchesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 300)...)
	e.publish(msgs(280, 300)...) // a producer that republished: same ids, same bodies
	e.runLive(e.consumer(nil, nil), 319)
	live := e.totals()
	require.Equal(t, expectedTotals(0, 300), live)
	// The live effects went out.
	_, err := e.pool.Exec(ctx, `UPDATE `+e.tables.Table("ledger")+` SET status = 'succeeded'`)
	require.NoError(t, err)

	// The new handler version records one more kind of effect: a rebuild
	// must not send it for history.
	progress := &lockedWriter{}
	s, err := Run(ctx, e.consumer(&handler{e: e, extra: true}, nil),
		Options{Mode: idem.Rebuild, Reset: e.reset, Progress: progress, ProgressInterval: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, live, e.totals(), "the rebuilt projection differs from the live one")
	for id, n := range e.applied() {
		require.Equal(t, 1, n, "message %s applied %d times by the rebuild", id, n)
	}
	require.EqualValues(t, 300, s.Processed)
	require.EqualValues(t, 20, s.Duplicates, "duplicates are skipped in the rebuild's own scope")
	require.True(t, s.HasHandoff)
	require.EqualValues(t, 319, s.Handoff)
	require.EqualValues(t, 319, e.checkpoint("test"), "the live consumer continues after the hand-off")
	require.Zero(t, s.CaughtUp)
	require.Contains(t, progress.String(), "100%")

	require.Equal(t, 5, e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE effect_type = 'welcome' AND status = 'suppressed'`))
	require.Equal(t, 300, e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE effect_type = 'notify' AND status = 'succeeded'`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE status NOT IN ('succeeded', 'suppressed')`),
		"a rebuild made an effect dispatchable")

	// Live consumption continues after the hand-off: nothing twice, nothing missing.
	e.publish(msgs(300, 320)...)
	e.runLive(e.consumer(nil, nil), 339)
	require.Equal(t, expectedTotals(0, 320), e.totals())
	for id, n := range e.applied() {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
}

func TestRebuildCatchesUpPastTheLiveCheckpointLikeTheLiveConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 50)...)
	e.runLive(e.consumer(nil, nil), 49)
	e.publish(msgs(50, 80)...) // the live worker is stopped and lags

	s, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Rebuild, Reset: e.reset, BatchSize: 16})
	require.NoError(t, err)
	require.EqualValues(t, 30, s.CaughtUp)
	require.EqualValues(t, 79, s.Handoff)
	require.EqualValues(t, 79, e.checkpoint("test"))
	require.Equal(t, expectedTotals(0, 80), e.totals())
	// The caught-up messages' effects are dispatched, like live ones; the
	// rebuilt ones keep the status the live consumer gave them.
	require.Equal(t, 80, e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE status = 'pending'`))
	require.Equal(t, 80, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = 'test'`),
		"caught-up messages are in the live inbox, so their redeliveries are duplicates")
}

func TestRebuildEndingBeforeTheLiveCheckpointIsRefusedBeforeAnythingRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 40)...)
	e.runLive(e.consumer(nil, nil), 39)
	reset := false
	_, err := Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, To: Offset(20),
		Reset: func(context.Context, pgx.Tx) error { reset = true; return nil }})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "before the live consumer's checkpoint 39")
	require.False(t, reset)
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_runs")))
	require.Equal(t, expectedTotals(0, 40), e.totals())
}

func TestRebuildFailsFastWhileALiveWorkerHoldsTheStreamLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 10)...)
	c := e.consumer(nil, nil)
	lock, err := pglock.Acquire(ctx, e.pool, store.StreamLockKey(e.tables, c.Config().Name, c.Config().Stream), pglock.Config{Logger: testLogger()})
	require.NoError(t, err)
	_, err = Run(ctx, c, Options{Mode: idem.Rebuild, Reset: e.reset})
	require.ErrorIs(t, err, ErrLiveWorker)
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_runs")))

	// With Wait, the rebuild starts once the live worker lets go.
	released := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = lock.Release(ctx)
		close(released)
	}()
	s, err := Run(ctx, c, Options{Mode: idem.Rebuild, Reset: e.reset, Wait: true})
	<-released
	require.NoError(t, err)
	require.EqualValues(t, 10, s.Processed)
}

func TestKilledReplayResumesFromItsCheckpointWithoutApplyingAnythingTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 1000)...)
	e.publish(msgs(500, 520)...)
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied atomic.Int64
	h := &handler{e: e, onApply: func() {
		if applied.Add(1) == 430 {
			kill() // the process dies in the middle of a batch
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Rebuild, Reset: e.reset, BatchSize: 50, RunID: "run-1"})
	require.Error(t, err)
	require.ErrorContains(t, err, "resume with run id run-1")
	partial := len(e.applied())
	require.Greater(t, partial, 0)
	require.Less(t, partial, 1000)
	require.EqualValues(t, partial-1, e.checkpoint(runScope("test", "run-1")), "the checkpoint is the last committed message")

	s, err := Run(context.Background(), e.consumer(&handler{e: e}, nil), Options{Mode: idem.Rebuild, RunID: "run-1",
		Reset: func(context.Context, pgx.Tx) error { return errors.New("a resumed run must not reset again") }})
	require.NoError(t, err)
	require.True(t, s.Resumed)
	require.EqualValues(t, partial, s.First)
	require.EqualValues(t, 1019, s.Last)
	require.EqualValues(t, 1019, s.Handoff)
	require.Equal(t, expectedTotals(0, 1000), e.totals())
	got := e.applied()
	require.Len(t, got, 1000)
	for id, n := range got {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}

	// Running a finished run again does nothing.
	s, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, RunID: "run-1"})
	require.NoError(t, err)
	require.Zero(t, s.Messages)
	require.EqualValues(t, 1019, s.Handoff)
}

func TestResumedRebuildRefusesAProjectionTheLiveConsumerWroteTo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 100)...)
	e.runLive(e.consumer(nil, nil), 99)
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied atomic.Int64
	h := &handler{e: e, onApply: func() {
		if applied.Add(1) == 30 {
			kill()
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Rebuild, Reset: e.reset, BatchSize: 20, RunID: "run-2"})
	require.Error(t, err)
	// While the rebuild was down, a live worker took the lock and went on.
	e.publish(msgs(100, 110)...)
	e.runLive(e.consumer(nil, nil), 109)
	_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, RunID: "run-2"})
	require.ErrorIs(t, err, ErrLiveMoved)
}

func TestFailingHandlerIsRetriedInPlaceThenDeadLetteredAndTheReplayGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(msgs(0, 10)...)
	e.publish(streamio.Outgoing{MessageID: "m-bad", Body: body(event{Key: "k0", Fail: true})})
	e.publish(msgs(10, 20)...)
	c := e.consumer(nil, func(cfg *consumer.Config) { cfg.MaxAttempts = 3 })
	s, err := Run(context.Background(), c, Options{Mode: idem.Normal, RetryDelay: time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 20, s.Processed)
	require.EqualValues(t, 1, s.DeadLettered)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+` WHERE message_id = 'm-bad' AND reason = 'max_attempts' AND attempts = 3`))
	require.EqualValues(t, 20, e.checkpoint(runScope("test", s.RunID)))
	require.Equal(t, "finished", e.runStatus(s.RunID))
}

func TestRepairRerunsOnlyTheSelectedMessagesAndAuditsEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 40)...)
	c := e.consumer(nil, nil)
	_, err := Run(ctx, c, Options{Mode: idem.Normal}) // what the live consumer does
	require.NoError(t, err)
	// Two effects failed for good; only the selected message's goes again.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.tables.Table("ledger")+` SET status = 'failed_terminal' WHERE message_id IN ('m-7', 'm-8')`)
	require.NoError(t, err)

	s, err := Run(ctx, c, Options{Mode: idem.Repair, Select: Selection{Keys: []string{"k1"}, IDs: []string{"m-7"}},
		Operator: "alice", Reason: "INC-42 wrong totals", Redispatch: true})
	require.NoError(t, err)
	require.EqualValues(t, 9, s.Processed, "k1 is m-1, m-6 … m-36 (8 messages), plus m-7")
	require.EqualValues(t, 31, s.Skipped)
	require.Equal(t, 1, s.Redispatched)
	for id, n := range e.applied() {
		want := 1
		if id == "m-7" || atoi(id[2:])%5 == 1 {
			want = 2
		}
		require.Equal(t, want, n, "message %s applied %d times", id, n)
	}
	require.Equal(t, 9, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_audit")+
		` WHERE run_id = $1 AND operator = 'alice' AND reason = 'INC-42 wrong totals' AND outcome = 'processed' AND inbox = 'duplicate'`, s.RunID))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_audit")+` WHERE message_id = 'm-7' AND business_key = 'k2'`))

	m7, err := e.ledger.Get(ctx, ledger.EffectID("notify", "m-7"))
	require.NoError(t, err)
	require.Equal(t, ledger.StatusPending, m7.Status)
	history, err := e.ledger.History(ctx, m7.ID)
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, "alice", history[0].Operator)
	m8, err := e.ledger.Get(ctx, ledger.EffectID("notify", "m-8"))
	require.NoError(t, err)
	require.Equal(t, ledger.StatusFailedTerminal, m8.Status, "an effect of a message not selected was sent again")
}

func TestReplayRejectsArgumentsThatMakeNoSenseBeforeAnythingRuns(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c, err := consumer.New(consumer.Config{Name: "test", Pool: pool, Stream: "s", StreamURL: "rabbitmq-stream://nobody@127.0.0.1:1/",
		Topology: consumer.Passive})
	require.NoError(t, err)
	c.Handle(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	future := time.Now().Add(time.Hour)
	p, err := projection.New(projection.Config{Name: "p", Tables: []string{"t"}})
	require.NoError(t, err)
	reset := func(context.Context, pgx.Tx) error { return nil }
	for name, o := range map[string]Options{
		"projection outside rebuild": {Mode: idem.Normal, Projection: p},
		"online rebuild with reset":  {Mode: idem.Rebuild, Projection: p, Reset: reset},
		"online rebuild with wait":   {Mode: idem.Rebuild, Projection: p, Wait: true},
		"online rebuild to offset":   {Mode: idem.Rebuild, Projection: p, To: Offset(10)},
		"no mode":                    {},
		"unknown mode":               {Mode: "replay-everything"},
		"end before start":           {Mode: idem.Normal, From: Offset(10), To: Offset(5)},
		"end time before start":      {Mode: idem.Normal, From: Time(future.Add(-3 * time.Hour)), To: Time(future.Add(-4 * time.Hour))},
		"start in the future":        {Mode: idem.Normal, From: Time(future)},
		"end in the future":          {Mode: idem.Forensic, To: Time(future)},
		"start at the tail":          {Mode: idem.Normal, From: Tail()},
		"rebuild to a time":          {Mode: idem.Rebuild, To: Time(time.Now().Add(-time.Hour))},
		"repair without selection":   {Mode: idem.Repair, Operator: "a", Reason: "b"},
		"repair without a reason":    {Mode: idem.Repair, Select: Selection{IDs: []string{"m-1"}}, Operator: "a"},
		"selection outside repair":   {Mode: idem.Normal, Select: Selection{IDs: []string{"m-1"}}},
		"reset outside rebuild":      {Mode: idem.Normal, Reset: func(context.Context, pgx.Tx) error { return nil }},
		"forensic with a run id":     {Mode: idem.Forensic, RunID: "x"},
		"keys without business key":  {Mode: idem.Repair, Select: Selection{Keys: []string{"k"}}, Operator: "a", Reason: "b"},
	} {
		_, err := Run(context.Background(), c, o)
		require.ErrorIs(t, err, ErrInvalidOptions, name)
	}
}

func (e *env) runStatus(id string) string {
	e.t.Helper()
	var s string
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT status FROM `+e.tables.Table("replay_runs")+` WHERE run_id = $1`, id).Scan(&s))
	return s
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscan(s, &n)
	return n
}

// A stream has no dead-letter queue: a dead-lettered stream message is
// retried by a repair replay of its id once the handler is fixed, and the
// repair marks its dead-letter row, as a redrive marks a queue's.
func TestRepairOfADeadLetteredStreamMessageMarksItsRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 3)...)
	e.publish(streamio.Outgoing{MessageID: "m-reject", Body: body(event{Key: "k1", N: 7, Reject: true})})
	live := e.consumer(nil, nil)
	e.runLive(live, 3)
	dead := `SELECT count(*) FROM ` + e.tables.Table("dead_letters") + ` WHERE consumer = 'test' AND message_id = 'm-reject'`
	require.Equal(t, 1, e.count(dead+` AND redriven_at IS NULL`))

	fixed := e.consumer(&handler{e: e, fixed: true}, nil)
	s, err := Run(ctx, fixed, Options{Mode: idem.Repair, Select: Selection{IDs: []string{"m-reject"}},
		Operator: "alice", Reason: "INC-9: rejected by a bug, fixed in v2"})
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Processed)
	require.Equal(t, 1, e.count(dead+` AND redriven_at IS NOT NULL AND redriven_by = $1`, "repair "+s.RunID+" by alice"))
	require.Equal(t, 1, e.applied()["m-reject"])
}

// A record the stream client cannot decode is dead-lettered as
// undecodable by a replay as by the live consumer, alone: the replay
// lives and reaches its end, and every other record is applied once.
func TestReplayDeadLettersARecordTheClientCannotDecodeAndGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(msgs(0, 5)...)
	testbroker.PublishRecords(t, streamio.URLFromEnv(), e.stream, testbroker.MapKeyedRecord, testbroker.GarbageRecord)
	e.publish(msgs(5, 10)...)

	s, err := Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Forensic})
	require.ErrorIs(t, err, ErrFindings)
	require.EqualValues(t, 2, s.DeadLettered)
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")), "a forensic replay writes nothing")

	s, err = Run(ctx, e.consumer(nil, nil), Options{Mode: idem.Normal})
	require.NoError(t, err)
	require.EqualValues(t, 11, s.Last)
	require.EqualValues(t, 10, s.Processed)
	require.EqualValues(t, 2, s.DeadLettered)
	require.Equal(t, expectedTotals(0, 10), e.totals())
	require.Equal(t, 2, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+` WHERE reason = $1 AND message_id IN ($2, $3)`,
		deadletters.ReasonUndecodable, "sha256:"+idem.HashBytes(testbroker.MapKeyedRecord).String(),
		"sha256:"+idem.HashBytes(testbroker.GarbageRecord).String()))
}
