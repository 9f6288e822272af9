package configerr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/configerr"
)

// A package's sentinel keeps its own text and identity, and matches
// ErrConfig, also when wrapped with a reason.
func TestSentinelKeepsItsTextAndMatchesErrConfig(t *testing.T) {
	t.Parallel()
	own := configerr.New("consumer: invalid config")
	other := configerr.New("consumer: invalid config")
	err := fmt.Errorf("%w: Queue is required", own)
	require.EqualError(t, err, "consumer: invalid config: Queue is required")
	require.ErrorIs(t, err, own)
	require.ErrorIs(t, err, configerr.ErrConfig)
	require.False(t, errors.Is(err, other), "two sentinels with one text are two sentinels")
}
