package inbox

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each chunk starts after the last key the chunk before it returned, never
// from the start again, and the deletion ends at the first short chunk.
func TestEachChunkStartsAfterTheLastKeyOfTheOneBefore(t *testing.T) {
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i+1)
	}
	var afters []string
	total, err := deleteInChunks(5, func(after string) (int64, string, error) {
		afters = append(afters, after)
		var gone []string
		for _, k := range keys {
			if k > after && len(gone) < 5 {
				gone = append(gone, k)
			}
		}
		if len(gone) == 0 {
			return 0, after, nil
		}
		return int64(len(gone)), gone[len(gone)-1], nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 12, total)
	require.Equal(t, []string{"", "k05", "k10"}, afters)
}

// A failing chunk ends the deletion with the rows deleted before it.
func TestAFailingChunkEndsTheDeletion(t *testing.T) {
	calls := 0
	total, err := deleteInChunks(5, func(after string) (int64, string, error) {
		calls++
		if calls == 2 {
			return 0, after, errors.New("connection lost")
		}
		return 5, "k05", nil
	})
	require.ErrorContains(t, err, "connection lost")
	require.EqualValues(t, 5, total)
}
