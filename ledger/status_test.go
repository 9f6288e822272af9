package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/ledger"
)

// A caller that changes the list of statuses changes its own copy: every
// call returns all of them in lifecycle order, and Valid still knows them.
func TestStatusesCannotBeChangedByACaller(t *testing.T) {
	t.Parallel()
	all := []ledger.Status{ledger.StatusPending, ledger.StatusInFlight, ledger.StatusSucceeded, ledger.StatusFailedRetryable,
		ledger.StatusFailedTerminal, ledger.StatusUnknown, ledger.StatusSuppressed}
	s := ledger.Statuses()
	require.Equal(t, all, s)
	s[0] = "bogus"
	require.Equal(t, all, ledger.Statuses())
	require.True(t, ledger.StatusPending.Valid())
	require.False(t, ledger.Status("bogus").Valid())
}
