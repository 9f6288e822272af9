package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An attempt whose transaction fails is not progress: the stall clock that
// started with the work keeps running through the retries, and only a
// commit resets it and ends the failing streak.
func TestFailedAttemptsAreNotProgress(t *testing.T) {
	t.Parallel()
	var v Vitals
	v.started()
	start := time.Unix(0, v.progress.Load())
	v.ended(failed(errors.New("connection refused")))
	for range 3 { // retries after a failure
		time.Sleep(5 * time.Millisecond)
		v.started()
		v.ended(failed(errors.New("connection refused")))
	}
	require.Equal(t, start, time.Unix(0, v.progress.Load()), "retries did not move the clock")
	v.started()
	d, stalled := v.Stalled(10 * time.Millisecond)
	require.True(t, stalled, "stalled for %s", d)
	_, why, failing := v.Failing(0)
	require.True(t, failing)
	require.Contains(t, why, "connection refused")

	v.ended(nil)
	_, _, failing = v.Failing(0)
	require.False(t, failing)
	require.True(t, time.Unix(0, v.progress.Load()).After(start))

	// A handler's failure is neither progress nor a failing database.
	v.started()
	v.ended(errNeedSavepoints)
	_, _, failing = v.Failing(0)
	require.False(t, failing)
}

// A database call of the runtime's own counts as unanswered once it has
// waited its lock wait and the limit on top, and stops counting once it is
// answered: a lock wait the call may take is not a silent database.
func TestADatabaseCallIsUnansweredOnlyBeyondItsLockWait(t *testing.T) {
	t.Parallel()
	var v Vitals
	_, late := v.Unanswered(0)
	require.False(t, late, "nothing in flight")

	queued := v.calls.Begin(time.Hour) // may wait for locks for an hour
	silent := v.calls.Begin(0)
	time.Sleep(20 * time.Millisecond)
	d, late := v.Unanswered(10 * time.Millisecond)
	require.True(t, late)
	require.GreaterOrEqual(t, d, 20*time.Millisecond)
	_, late = v.Unanswered(time.Minute)
	require.False(t, late, "within the limit")

	silent()
	_, late = v.Unanswered(10 * time.Millisecond)
	require.False(t, late, "the call within its lock wait is not late")
	queued()
	d, late = v.Unanswered(0)
	require.False(t, late)
	require.Zero(t, d, "nothing in flight")
}
