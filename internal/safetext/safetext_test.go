package safetext

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestCleanYieldsStorableText(t *testing.T) {
	s := Clean("a\x00b\xffc")
	require.True(t, utf8.ValidString(s))
	require.NotContains(t, s, "\x00")
	require.Equal(t, "ab\uFFFDc", s)
}

func TestTruncateNeverCutsACharacter(t *testing.T) {
	s := strings.Repeat("é", 10) // 2 bytes each
	for n := 0; n <= len(s); n++ {
		got := Truncate(s, n)
		require.True(t, utf8.ValidString(got), "n=%d", n)
		require.LessOrEqual(t, len(got), n)
	}
}

func TestErrorIsBoundedAndCleaned(t *testing.T) {
	require.Empty(t, Error(nil))
	long := Error(errors.New(strings.Repeat("x", 2*MaxError) + "\x00"))
	require.Len(t, long, MaxError)
	require.Equal(t, "abc…", ShortID("abc")[:3]+"…")
	require.Equal(t, 24+len("…"), len(ShortID(strings.Repeat("a", 40))))
}
