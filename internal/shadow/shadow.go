// Package shadow holds what the projection and replay packages share about
// a rebuild's shadow tables: their names, the scope of the rows a rebuild
// keeps beside the live ones, and the context mark that sends a handler's
// writes to the shadow.
package shadow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// suffix ends every shadow table's name.
const suffix = "__idem_rebuild"

// maxIdentifier is PostgreSQL's identifier limit in bytes (NAMEDATALEN-1).
const maxIdentifier = 63

// Table returns the name of table's shadow: table + "__idem_rebuild", or,
// when that would not fit PostgreSQL's 63 bytes, a prefix of table, a short
// hash of the whole name and the suffix, so that two long names never share
// a shadow.
func Table(table string) string {
	if len(table)+len(suffix) <= maxIdentifier {
		return table + suffix
	}
	sum := sha256.Sum256([]byte(table))
	h := hex.EncodeToString(sum[:4])
	keep := maxIdentifier - len(suffix) - len(h) - 1
	return truncate(table, keep) + "_" + h + suffix
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// Scope returns the scope under which a rebuild of projection keeps the
// rows idem stores for the projection (the parked events), beside the live
// scope, which is the projection's name.
func Scope(projection string) string { return projection + "@rebuild" }

type key struct{}

// With returns a context in which projection's handlers write to its shadow
// tables.
func With(ctx context.Context, projection string) context.Context {
	return context.WithValue(ctx, key{}, projection)
}

// From returns the projection being rebuilt in ctx; ok is false outside a
// rebuild into shadow tables.
func From(ctx context.Context) (projection string, ok bool) {
	projection, ok = ctx.Value(key{}).(string)
	return projection, ok
}
