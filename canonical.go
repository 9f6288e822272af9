package idem

import "github.com/idemkit/idem/internal/canonjson"

// ErrInvalidJSON is returned (wrapped, with the offset and the reason) when
// CanonicalJSON cannot canonicalise its input: a syntax error, invalid UTF-8,
// an unpaired surrogate escape, a duplicate object key, two keys of one
// object that differ only in case, nesting deeper than 1,000 arrays and
// objects, or a number whose exponent has more than 9 significant digits,
// as written or in the canonical form (1000e999999997 is 1e+1000000000).
var ErrInvalidJSON = canonjson.ErrInvalidJSON

// ErrInvalidID is returned (wrapped, with the reason) for an id that has no
// one spelling: text that is not valid UTF-8 or holds a NUL, or a JSON id
// field whose value cannot be spelled as one id (consumer.IDFromJSONField).
// The runtime dead-letters such a message with reason invalid_id
// (deadletters.ReasonInvalidID); a consumer's own MessageID function may
// wrap it for the same result. An invalid id is refused, never repaired:
// replacing invalid bytes would make distinct raw ids one id.
var ErrInvalidID = canonjson.ErrInvalidID

// HashJSON returns the SHA-256 of CanonicalJSON(b): two payloads that differ
// only in key order, whitespace or the spelling of numbers hash the same.
func HashJSON(b []byte) (Hash, error) {
	c, err := canonjson.Canonical(b)
	if err != nil {
		return Hash{}, err
	}
	return HashBytes(c), nil
}

// CanonicalJSON returns one fixed spelling of the JSON value in b, so that
// documents which mean the same thing compare equal byte for byte:
//
//   - object keys are sorted by Unicode code point, and a repeated key is an
//     error (parsers disagree on which value wins, so its meaning is unclear);
//   - so are two keys of one object that differ only in case ("amt" and
//     "AMT"): Go's encoding/json fills a struct field from either spelling,
//     and the one that comes last wins, so {"amt":1,"AMT":2} and
//     {"AMT":2,"amt":1} decode to different values although they differ
//     only in key order;
//   - insignificant whitespace is removed;
//   - numbers are written in one form (1.0, 1, 1e0 and 10e-1 all become 1;
//     1e21 becomes 1e+21) that keeps the decimal value digit for digit and
//     never rounds it to a float64, so two different large integers never
//     collide; -0 becomes 0;
//   - strings keep their content exactly; the output escapes only '"', '\\'
//     and control characters (as \b \f \n \r \t or \u00xx) and writes every
//     other character as UTF-8.
//
// It rejects invalid UTF-8 rather than repairing it, and bounds nesting at
// 1,000 arrays and objects, so hostile payloads cannot exhaust the stack.
// Canonicalising the output again returns it unchanged. What it refuses is
// an error wrapping ErrInvalidJSON.
//
// This is not RFC 8785 (JCS), though it looks like it: RFC 8785 orders keys
// by UTF-16 code unit, not by code point (the two differ for characters
// outside the Basic Multilingual Plane), and serialises numbers as IEEE 754
// doubles, which rounds large integers and long fractions. Its output is
// meant for comparing payloads with each other, not with another JCS
// implementation's.
func CanonicalJSON(b []byte) ([]byte, error) { return canonjson.Canonical(b) }
