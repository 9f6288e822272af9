// Package safetext makes text that came from outside (producers' ids and
// headers, handlers' errors) storable and loggable: valid UTF-8, no NUL
// bytes, bounded in length; and printable on a terminal (Display).
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxError bounds the error text stored per dead letter or effect attempt.
const MaxError = 4096

// Clean makes s storable as PostgreSQL text: valid UTF-8 (a cut in the
// middle of a character becomes U+FFFD) and no NUL bytes.
func Clean(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// Truncate returns at most n bytes of s, cut at a character boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n-- // do not cut a multi-byte character
	}
	return s[:n]
}

// Error is err's text, bounded by MaxError and cleaned; "" for nil.
func Error(err error) string {
	if err == nil {
		return ""
	}
	return Clean(Truncate(err.Error(), MaxError))
}

// Abbreviate returns s cut to n bytes with an ellipsis, for display.
func Abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Truncate(s, n) + "…"
}

// ShortID truncates an id for logs: ids may carry business data.
func ShortID(id string) string { return Abbreviate(id, 24) }

// Display returns s fit for a terminal, a table cell or a line of text:
// every rune that is not printable is escaped the way Go escapes it (\x1b,
// \u202e, \xff for a byte that is not UTF-8), so that text from outside can
// neither steer the terminal (escape sequences) nor reorder what it shows
// (bidi overrides) nor forge a line or a column (newlines, tabs). Not
// printable are control characters, format characters (bidi controls,
// zero-width ones), spaces other than U+0020, private and unassigned
// runes: everything unicode.IsPrint refuses. The rest, backslashes
// included, is kept as it is.
func Display(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xFFFF:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}
