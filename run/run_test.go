package run

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// untilDone is a part that runs until its context ends and counts stops.
func untilDone(stopped *atomic.Int32) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		stopped.Add(1)
		return nil
	}
}

func TestTheFirstPartToReturnStopsTheOthers(t *testing.T) {
	t.Parallel()
	var stopped atomic.Int32
	err := All(context.Background(), untilDone(&stopped), func(context.Context) error { return nil }, untilDone(&stopped))
	require.NoError(t, err)
	require.Equal(t, int32(2), stopped.Load())
}

func TestAllReturnsTheFirstErrorOnceEveryPartReturned(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var stopped atomic.Int32
	err := All(context.Background(), untilDone(&stopped), func(context.Context) error { return boom },
		func(ctx context.Context) error {
			<-ctx.Done()
			stopped.Add(1)
			return errors.New("stopped after boom")
		})
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "part 2")
	require.Equal(t, int32(2), stopped.Load())
}

func TestAllStopsEveryPartWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var stopped atomic.Int32
	done := make(chan error, 1)
	go func() { done <- All(ctx, untilDone(&stopped), untilDone(&stopped)) }()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("All did not return after its context ended")
	}
	require.Equal(t, int32(2), stopped.Load())
}

func TestAPartThatIgnoresTheStopIsReportedAfterTheStopTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stubborn := func(context.Context) error { <-release; return nil }
	start := time.Now()
	err := all(context.Background(), 50*time.Millisecond, []func(context.Context) error{
		stubborn, func(context.Context) error { return nil },
	})
	require.ErrorIs(t, err, ErrStopTimeout)
	require.ErrorContains(t, err, "parts [1]")
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestNoPartsIsNothingToRun(t *testing.T) {
	t.Parallel()
	require.NoError(t, All(context.Background()))
}
