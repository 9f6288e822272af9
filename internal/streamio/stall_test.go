package streamio

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/streamclient/stream"
	"github.com/stretchr/testify/require"
)

// closeUnreported makes e close the nth consumer it creates (counting from
// 1) before the caller can register for its close notification: the window
// the client leaves between NewConsumer and NotifyClose, in which a dropped
// socket or a metadata update closes a consumer without telling anyone. The
// channel returned is closed once that consumer is.
func closeUnreported(e *Env, nth int64) <-chan struct{} {
	var n atomic.Int64
	closed := make(chan struct{})
	e.subscribed = func(c *stream.Consumer) {
		if n.Add(1) == nth {
			_ = c.Close()
			close(closed)
		}
	}
	return closed
}

// watchedStream opens an Env whose stall watchdog gives up on a silent
// consumer after 200ms, and a new stream on it.
func watchedStream(t *testing.T) (*Env, string) {
	t.Helper()
	e := openEnv(t)
	e.stall = 200 * time.Millisecond
	return e, newStream(t, e)
}

func TestFollowReturnsConnectionLostWhenItsConsumerClosesUnreported(t *testing.T) {
	t.Parallel()
	e, name := watchedStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.Publish(ctx, name, messages("m", 3)))
	closed := closeUnreported(e, 1) // Follow's subscription; the later ones are its tail probes

	c := &collector{tb: t}
	done := make(chan error, 1)
	go func() { done <- e.Follow(ctx, name, 0, 0, c.fn) }()
	// Whatever the consumer delivered before it closed, records are due now.
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Follow did not subscribe")
	}
	require.NoError(t, e.Publish(ctx, name, messages("n", 3)))
	requireConnectionLost(t, done, "Follow still waits on a consumer that closed unreported")
}

func TestReadReturnsConnectionLostWhenItsConsumerClosesUnreported(t *testing.T) {
	t.Parallel()
	e, name := watchedStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []string{"a", "b", "c"} { // a chunk each
		require.NoError(t, e.Publish(ctx, name, messages(p, 3)))
	}
	closeUnreported(e, 2) // the first consumer is the tail probe

	// With room for one record, the consumer hands over at most its first
	// chunk before it closes: the closing drops the chunks it queued.
	done := make(chan error, 1)
	go func() {
		done <- e.Read(ctx, ReadSpec{Stream: name, MaxBatch: 1}, func(context.Context, []Record) error { return nil })
	}()
	requireConnectionLost(t, done, "Read still waits on a consumer that closed unreported")
}

func TestTailFindsRecordsWhenItsProbeClosesUnreported(t *testing.T) {
	t.Parallel()
	e := openEnv(t)
	name := newStream(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.Publish(ctx, name, messages("m", 5)))
	closeUnreported(e, 1)

	last, ok, err := e.Tail(ctx, name)
	require.NoError(t, err)
	require.True(t, ok, "a probe closed unreported made Tail call the stream empty")
	require.Equal(t, int64(4), last)
}
