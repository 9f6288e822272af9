package idem_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Every outcome has a name, and how a source settles it follows from Final
// and Copied alone: acked as it is, acked once its copy is stored, or
// handed back.
func TestEveryOutcomeIsNamedAndSettledOneWay(t *testing.T) {
	acked, copied, handedBack := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, o := range idem.Outcomes() {
		require.NotEqual(t, "undecided", o.String(), "outcome %d has no name", o)
		switch {
		case o.Copied():
			copied[o.String()] = true
		case o.Final():
			acked[o.String()] = true
		default:
			handedBack[o.String()] = true
		}
	}
	require.Equal(t, map[string]bool{"processed": true, "duplicate": true, "skipped": true}, acked)
	require.Equal(t, map[string]bool{"dead_lettered": true, "retried": true}, copied)
	require.Equal(t, map[string]bool{"unresolved": true, "held": true, "postponed": true}, handedBack)
	require.Equal(t, idem.MaxOutcome, idem.Outcomes()[len(idem.Outcomes())-1])
}
