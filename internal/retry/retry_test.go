package retry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffDoublesWithinItsCapAndNeverComesBackEarly(t *testing.T) {
	for n := 1; n <= 12; n++ {
		want := min(10*time.Millisecond<<(n-1), time.Second)
		for range 50 {
			d := Backoff(n, 10*time.Millisecond, time.Second)
			require.GreaterOrEqual(t, d, want/2, "attempt %d", n)
			require.LessOrEqual(t, d, want, "attempt %d", n)
		}
	}
	require.Zero(t, Backoff(3, 0, time.Second))
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Sleep(ctx, time.Hour))
	require.True(t, Sleep(context.Background(), time.Millisecond))
}
