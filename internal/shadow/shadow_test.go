package shadow

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestShadowNamesFitPostgresAndNeverCollide(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order_overview__idem_rebuild", Table("order_overview"))
	long := strings.Repeat("a", 60)
	a, b := Table(long+"x"), Table(long+"y")
	require.LessOrEqual(t, len(a), maxIdentifier)
	require.NotEqual(t, a, b, "two long names cut to the same prefix share a shadow")
	multi := Table(strings.Repeat("é", 40))
	require.LessOrEqual(t, len(multi), maxIdentifier)
	require.True(t, utf8.ValidString(multi), "a cut split a UTF-8 sequence: %q", multi)
}

func TestTheMarkSaysWhichProjectionIsRebuilt(t *testing.T) {
	t.Parallel()
	_, ok := From(context.Background())
	require.False(t, ok)
	p, ok := From(With(context.Background(), "overview"))
	require.True(t, ok)
	require.Equal(t, "overview", p)
}
