package stream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/retry"
)

// A session on a quiet stream commits nothing; once it lasted retry.Steady
// it worked all the same, so that a reader idle for days restarts after a
// short delay instead of the longest one.
func TestSessionWorkedIfItCommittedOrLastedSteady(t *testing.T) {
	require.True(t, sessionWorked(true, time.Millisecond), "a session that committed")
	require.True(t, sessionWorked(false, retry.Steady), "a quiet session that lasted")
	require.False(t, sessionWorked(false, retry.Steady-time.Second), "a short session that committed nothing")
}
