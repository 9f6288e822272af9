package idem_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// Message ids made one after another sort in the order they were made,
// within one millisecond too, and are UUIDs of version 7.
func TestNewMessageIDsSortInTheOrderTheyAreMade(t *testing.T) {
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = idem.NewMessageID()
	}
	require.True(t, slices.IsSorted(ids))
	require.Len(t, slices.Compact(slices.Clone(ids)), len(ids))
	for _, id := range ids[:10] {
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	}
}
