// Package safetext makes text that came from outside (producers' ids and
// headers, handlers' errors) storable and loggable: valid UTF-8, no NUL
// bytes, bounded in length.
package safetext

import "strings"

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
