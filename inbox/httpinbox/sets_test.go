package httpinbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// A caller that changes a list the package hands out changes its own copy:
// the defaults and the states stay what they are for every other caller.
func TestListsThePackageHandsOutCannotBeChangedByACaller(t *testing.T) {
	t.Parallel()
	headers := httpinbox.DefaultStoredHeaders()
	want := append([]string(nil), headers...)
	headers[0] = "Set-Cookie"
	require.Equal(t, want, httpinbox.DefaultStoredHeaders())
	require.Equal(t, "Content-Type", want[0])

	keys := httpinbox.KeyStates()
	require.Equal(t, []httpinbox.KeyState{httpinbox.KeyStarted, httpinbox.KeyCompleted, httpinbox.KeyFailedReplayable, httpinbox.KeyUnknown}, keys)
	keys[0] = "bogus"
	require.Equal(t, httpinbox.KeyStarted, httpinbox.KeyStates()[0])
	require.False(t, httpinbox.KeyState("bogus").Valid())

	ops := httpinbox.OperationStates()
	require.Equal(t, []httpinbox.OperationState{httpinbox.OperationAccepted, httpinbox.OperationRunning,
		httpinbox.OperationSucceeded, httpinbox.OperationFailed, httpinbox.OperationUnknown}, ops)
	ops[0] = "bogus"
	require.Equal(t, httpinbox.OperationAccepted, httpinbox.OperationStates()[0])
	require.False(t, httpinbox.OperationState("bogus").Valid())
}
