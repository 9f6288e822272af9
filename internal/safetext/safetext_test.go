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

func TestDisplayEscapesWhatCouldSteerATerminal(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"m-1":                             "m-1",
		"café 東京 🚀 a\\b \uFFFD":           "café 東京 🚀 a\\b \uFFFD",
		"\x1b[2J\x1b[31mred":              `\x1b[2J\x1b[31mred`,
		"a\nb\tc\rd\x7f\x00":              `a\x0ab\x09c\x0dd\x7f\x00`,
		"\u0085\u009b31m":                 `\u0085\u009b31m`,  // C1 controls: NEL, CSI
		"abc\u202egpj.exe":                `abc\u202egpj.exe`, // right-to-left override
		"\u2066x\u2069\u200e\u200f\u061c": `\u2066x\u2069\u200e\u200f\u061c`,
		"a\u200bb\u00a0c\u2028d":          `a\u200bb\u00a0c\u2028d`, // zero-width and other spaces, line separator
		"\U000e0041\U000f0000":            `\U000e0041\U000f0000`,   // tag and private-use runes
		"bad\xff\xc3":                     `bad\xff\xc3`,
	} {
		got := Display(in)
		require.Equal(t, want, got, "%q", in)
		require.Equal(t, got, Display(got), "escaping twice changes nothing")
	}
}
