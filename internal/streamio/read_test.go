package streamio

import (
	"context"
	"errors"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/stretchr/testify/require"
)

func TestReadFromFirstStopsAtTailFixedAtStartWhileProducerAppends(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	early := messages("early", 100)
	require.NoError(t, e.Publish(ctx, name, early))

	// Once Read has delivered its first batch (its end is fixed by then), a
	// producer appends until Read returns. The first batch waits until at
	// least one late message is confirmed, so Read must really ignore them.
	var appended atomic.Int64
	start := make(chan struct{})
	stop := make(chan struct{})
	producerDone := make(chan error, 1)
	go func() {
		select {
		case <-start:
		case <-stop:
			producerDone <- nil
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				producerDone <- nil
				return
			default:
			}
			if err := e.Publish(ctx, name, messages("late", 10)); err != nil {
				producerDone <- err
				return
			}
			appended.Add(10)
		}
	}()

	c := &collector{tb: t, maxBatch: 10}
	first := true
	err := e.Read(ctx, ReadSpec{Stream: name, MaxBatch: 10}, func(ctx context.Context, batch []Record) error {
		if first {
			first = false
			close(start)
			for appended.Load() == 0 {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				time.Sleep(time.Millisecond)
			}
		}
		return c.fn(ctx, batch)
	})
	close(stop)
	require.NoError(t, err)
	require.NoError(t, <-producerDone)
	require.Positive(t, appended.Load())

	got := c.snapshot()
	require.Equal(t, idsOf(early), ids(got))
	for i, r := range got {
		require.Equal(t, int64(i), r.Offset)
		require.Equal(t, early[i].Body, r.Body)
	}
}

func TestReadOffsetRangeIsInclusiveAndIgnoresRestOfFinalChunk(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := messages("m", 100) // one Publish call: offsets 40 and 59 sit inside chunks
	require.NoError(t, e.Publish(ctx, name, msgs))

	c := &collector{tb: t, maxBatch: 7}
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, From: Offset(40), To: Offset(59), MaxBatch: 7}, c.fn))
	got := c.snapshot()
	require.Equal(t, idsOf(msgs[40:60]), ids(got))
	require.Equal(t, int64(40), got[0].Offset)
	require.Equal(t, int64(59), got[len(got)-1].Offset)
	require.Greater(t, c.batches, 1)
}

func TestReadCarriesMessageProperties(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	out := Outgoing{
		MessageID:             "order-1",
		CorrelationID:         "corr-1",
		ContentType:           "application/json",
		CreationTime:          created,
		ApplicationProperties: map[string]any{"tenant": "acme", "attempt": int64(2)},
		Body:                  []byte(`{"total":42}`),
	}
	require.NoError(t, e.Publish(ctx, name, []Outgoing{out}))

	c := &collector{tb: t}
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name}, c.fn))
	got := c.snapshot()
	require.Len(t, got, 1)
	r := got[0]
	require.Equal(t, int64(0), r.Offset)
	require.Equal(t, "order-1", r.MessageID)
	require.Equal(t, []string{"application/json", "corr-1"}, []string{r.ContentType, r.CorrelationID})
	require.True(t, created.Equal(r.Timestamp), "timestamp %s", r.Timestamp)
	require.Equal(t, "acme", r.Headers["tenant"])
	require.EqualValues(t, 2, r.Headers["attempt"])
	require.Equal(t, out.Body, r.Body)
}

func TestReadFromTimestampSkipsEarlierRecords(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := messages("before", 20)
	require.NoError(t, e.Publish(ctx, name, before))
	mark := time.Now()
	after := messages("after", 20)
	require.NoError(t, e.Publish(ctx, name, after))

	c := &collector{tb: t}
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, From: Time(mark)}, c.fn))
	require.Equal(t, idsOf(after), ids(c.snapshot()))
}

func TestReadToTimestampStopsBeforeLaterRecords(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := messages("before", 20)
	require.NoError(t, e.Publish(ctx, name, before))
	mark := time.Now()
	require.NoError(t, e.Publish(ctx, name, messages("after", 20)))

	c := &collector{tb: t}
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, To: Time(mark)}, c.fn))
	require.Equal(t, idsOf(before), ids(c.snapshot()))
}

func TestReadEmptyRangesReturnWithoutRecords(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	never := func(context.Context, []Record) error {
		t.Error("fn called for an empty range")
		return nil
	}

	empty := newStream(t, e)
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: empty}, never))

	name := newStream(t, e)
	require.NoError(t, e.Publish(ctx, name, messages("m", 5)))
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, From: Offset(5)}, never))
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, From: Time(time.Now().Add(-time.Millisecond))}, never))
	require.NoError(t, e.Read(ctx, ReadSpec{Stream: name, To: Time(time.Now().Add(-time.Hour))}, never))
}

func TestReadRejectsRangesThatEndBeforeTheyStart(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx := context.Background()
	fn := func(context.Context, []Record) error { return nil }
	now := time.Now()

	err := e.Read(ctx, ReadSpec{Stream: name, From: Offset(10), To: Offset(9)}, fn)
	require.ErrorIs(t, err, ErrEndBeforeStart)
	err = e.Read(ctx, ReadSpec{Stream: name, From: Time(now.Add(-time.Minute)), To: Time(now.Add(-time.Hour))}, fn)
	require.ErrorIs(t, err, ErrEndBeforeStart)
	err = e.Read(ctx, ReadSpec{Stream: name, From: Time(now.Add(time.Hour))}, fn)
	require.ErrorIs(t, err, ErrStartInFuture)
	err = e.Read(ctx, ReadSpec{Stream: name, From: Tail()}, fn)
	require.ErrorIs(t, err, ErrInvalidSpec)
}

func TestReadReturnsHandlerErrorAndStops(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.Publish(ctx, name, messages("m", 50)))

	boom := errors.New("boom")
	calls := 0
	err := e.Read(ctx, ReadSpec{Stream: name, MaxBatch: 5}, func(context.Context, []Record) error {
		calls++
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, calls)
}

func TestReadOfMissingStreamFails(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	err := e.Read(context.Background(), ReadSpec{Stream: "idem-no-such-stream"}, func(context.Context, []Record) error { return nil })
	require.ErrorIs(t, err, ErrStreamNotFound)
}

func TestTailIsLastCommittedOffset(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, ok, err := e.Tail(ctx, name)
	require.NoError(t, err)
	require.False(t, ok)

	require.NoError(t, e.Publish(ctx, name, messages("a", 30)))
	require.NoError(t, e.Publish(ctx, name, messages("b", 12)))
	last, ok, err := e.Tail(ctx, name)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(41), last)
}

func TestFollowDeliversNewRecordsAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := messages("a", 5)
	require.NoError(t, e.Publish(ctx, name, first))

	followCtx, stopFollow := context.WithCancel(ctx)
	c := &collector{tb: t, maxBatch: 4}
	done := make(chan error, 1)
	go func() { done <- e.Follow(followCtx, name, 3, 4, c.fn) }()

	second := messages("b", 10)
	require.NoError(t, e.Publish(ctx, name, second))
	want := append(idsOf(first[3:]), idsOf(second)...)
	require.Eventually(t, func() bool { return len(c.snapshot()) >= len(want) }, 20*time.Second, 5*time.Millisecond)
	stopFollow()
	require.NoError(t, <-done)

	got := c.snapshot()
	require.Equal(t, want, ids(got))
	require.Equal(t, int64(3), got[0].Offset)
}

func TestFollowReturnsErrorWhenSubscriptionDrops(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := newStream(t, e)
	require.NoError(t, e.Publish(ctx, name, messages("m", 3)))

	c := &collector{tb: t}
	done := make(chan error, 1)
	go func() { done <- e.Follow(ctx, name, 0, 0, c.fn) }()
	require.Eventually(t, func() bool { return len(c.snapshot()) == 3 }, 20*time.Second, 5*time.Millisecond)

	// Deleting the stream makes the broker end the subscription, as a lost
	// connection or a moved leader does.
	require.NoError(t, e.DeleteStream(ctx, name))
	requireConnectionLost(t, done, "Follow did not return after its stream was deleted")
}

func TestFollowReturnsErrorWhenConnectionDrops(t *testing.T) {
	t.Parallel()
	direct := openEnv(t)
	name := newStream(t, direct)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, direct.Publish(ctx, name, messages("m", 3)))

	u, err := url.Parse(URLFromEnv())
	require.NoError(t, err)
	p := testbroker.NewProxyTo(t, u.Host)
	e, err := Open(ctx, Config{URI: proxyURI(t, p)})
	require.NoError(t, err)
	defer e.Close()

	c := &collector{tb: t}
	done := make(chan error, 1)
	go func() { done <- e.Follow(ctx, name, 0, 0, c.fn) }()
	require.Eventually(t, func() bool { return len(c.snapshot()) == 3 }, 20*time.Second, 5*time.Millisecond)

	p.Sever()
	requireConnectionLost(t, done, "Follow did not return after its connection dropped")

	// The caller's loop resumes after what it has: the same Env reconnects.
	followCtx, stopFollow := context.WithCancel(ctx)
	go func() { done <- e.Follow(followCtx, name, 3, 0, c.fn) }()
	require.NoError(t, direct.Publish(ctx, name, messages("after", 2)))
	require.Eventually(t, func() bool { return len(c.snapshot()) == 5 }, 20*time.Second, 5*time.Millisecond)
	stopFollow()
	require.NoError(t, <-done)
	require.Equal(t, []string{"m-0", "m-1", "m-2", "after-0", "after-1"}, ids(c.snapshot()))
}

func TestCloseEndsRunningFollowAndLaterCalls(t *testing.T) {
	t.Parallel()
	shared := openEnv(t)
	name := newStream(t, shared)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, shared.Publish(ctx, name, messages("m", 2)))

	e, err := Open(ctx, Config{URI: URLFromEnv()})
	require.NoError(t, err)
	c := &collector{tb: t}
	done := make(chan error, 1)
	go func() { done <- e.Follow(ctx, name, 0, 0, c.fn) }()
	require.Eventually(t, func() bool { return len(c.snapshot()) == 2 }, 20*time.Second, 5*time.Millisecond)

	require.NoError(t, e.Close())
	requireConnectionLost(t, done, "Follow did not return after Close")
	_, _, err = e.Tail(ctx, name)
	require.ErrorIs(t, err, ErrClosed)
}
