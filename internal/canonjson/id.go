package canonjson

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrInvalidID is returned (wrapped, with the reason) for an id that has no
// one spelling: text that is not valid UTF-8 or holds a NUL (CheckID), or a
// JSON id field whose value cannot be spelled as one id (FieldID). It is
// idem.ErrInvalidID, whose doc comment says what the runtime does with it.
var ErrInvalidID = errors.New("idem: invalid id")

// CheckID reports whether id is text an id can be: valid UTF-8 without NUL
// (PostgreSQL text cannot hold NUL). Otherwise it returns an error wrapping
// ErrInvalidID. The runtime checks every id with it, whatever its source: a
// message-id property, a header, a stream message's properties, a JSON
// field or a consumer's own MessageID function.
func CheckID(id string) error {
	if problem := idProblem(id); problem != "" {
		return fmt.Errorf("%w: %s", ErrInvalidID, problem)
	}
	return nil
}

// idProblem says why id is not text an id can be, or returns "".
func idProblem(id string) string {
	if !utf8.ValidString(id) {
		return fmt.Sprintf("invalid UTF-8 at byte %d", invalidUTF8At([]byte(id)))
	}
	if i := strings.IndexByte(id, 0); i >= 0 {
		return fmt.Sprintf("NUL at byte %d", i)
	}
	return ""
}

// FieldID returns the id that the top-level member field of the JSON
// object in body spells, read by the rules Canonical hashes by, so that
// two bodies with one canonical form give one id:
//
//   - a number's id is its canonical spelling, the one Canonical writes:
//     1000, 1000.0, 1e3, 1E3 and 10e2 are all the id 1000; 1e21 is 1e+21,
//     -0 is 0, and 12345678901234567890 keeps every digit;
//   - a string's id is its content, escapes decoded ("\u0041" is "A") and
//     nothing else changed, so the string "1e3" is the id 1e3, not 1000;
//   - a missing member, null and "" are no id: FieldID returns "" and
//     no error.
//
// The string "1000" and the number 1000 are different JSON values that
// hash differently, but spell the same id 1000: a message that spells its
// id the other way round is a payload conflict under that id, never a
// second message.
//
// A value with no one id spelling is refused with an error wrapping
// ErrInvalidID: a string with invalid UTF-8, an unpaired surrogate escape
// (\ud800) or a NUL; a number Canonical refuses (an exponent of more
// than 9 digits, as written or once canonical); true, false, an array or an object. A body that
// Canonical refuses for any other reason (a syntax error, in the id's
// value too; invalid UTF-8 or a long exponent elsewhere; a repeated key;
// keys that differ only in case), or that is not an object, is refused
// with an error wrapping ErrInvalidJSON only: its meaning, and so its id,
// is unclear.
func FieldID(body []byte, field string) (string, error) {
	p := jsonParser{in: body, field: &field}
	doc, err := p.document()
	if fe := (*fieldError)(nil); errors.As(err, &fe) {
		return "", fmt.Errorf("%w: field %q: %w", ErrInvalidID, field, fe.err)
	}
	if err != nil {
		return "", fmt.Errorf("idem: id field %q: %w", field, err)
	}
	if doc.kind != jsonObject {
		return "", fmt.Errorf("idem: id field %q: %w: the body is not an object", field, ErrInvalidJSON)
	}
	i, found := slices.BinarySearchFunc(doc.members, field, func(m jsonMember, k string) int { return strings.Compare(m.key, k) })
	if !found {
		return "", nil
	}
	v := doc.members[i].value
	switch {
	case v.kind == jsonString:
		if problem := idProblem(v.text); problem != "" {
			return "", fmt.Errorf("%w: field %q: %s", ErrInvalidID, field, problem)
		}
		return v.text, nil
	case v.kind == jsonLiteral && v.text == "null":
		return "", nil
	case v.kind == jsonLiteral && v.text != "true" && v.text != "false":
		return v.text, nil // a number, in canonical spelling
	default:
		return "", fmt.Errorf("%w: field %q is neither a string nor a number", ErrInvalidID, field)
	}
}
