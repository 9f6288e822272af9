// Package canonjson is idem's canonical JSON: the parser and writer behind
// idem.CanonicalJSON and idem.HashJSON, and the reading of an id from a
// JSON field by the same rules (FieldID, behind consumer.IDFromJSONField),
// so that ids and hashes agree: two spellings of one value are one id or a
// refusal, never two ids.
//
// Its sentinels, ErrInvalidJSON and ErrInvalidID, are re-exported by the
// root package under the same names; callers outside the module branch on
// those.
package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is how deeply Canonical lets arrays and objects nest. Deeper
// input is rejected, so hostile payloads cannot exhaust the stack.
const MaxDepth = 1000

// maxExponentDigits bounds the significant digits of a number's exponent, so
// that 1e99999999999999999999 is rejected instead of overflowing.
const maxExponentDigits = 9

// maxExponent is the largest exponent of maxExponentDigits digits. The
// canonical form of a number never needs a longer one: a value whose
// exponent would (1000e999999997, 1e+1000000000) is refused like a long
// spelled exponent, so that the canonical form of a document always reads
// back.
const maxExponent = 999_999_999

// ErrInvalidJSON is returned (wrapped, with the offset and the reason) when
// Canonical cannot canonicalise its input: a syntax error, invalid UTF-8,
// an unpaired surrogate escape, a duplicate object key, two keys of one
// object that differ only in case, nesting deeper than MaxDepth, or a
// number whose exponent has more than 9 significant digits, as written or
// in the canonical form. It is idem.ErrInvalidJSON.
var ErrInvalidJSON = errors.New("idem: invalid JSON")

// Canonical returns one fixed spelling of the JSON value in b, so that
// documents which mean the same thing compare equal byte for byte. It is
// idem.CanonicalJSON, whose doc comment states the rules for users: keys
// sorted by code point (a repeated key, or two keys that differ only in
// case, is an error), insignificant whitespace removed, numbers in one
// exact decimal form, string content kept exactly. It rejects invalid
// UTF-8 rather than repairing it, and bounds nesting at MaxDepth.
// Canonicalising the output again returns it unchanged.
func Canonical(b []byte) ([]byte, error) {
	if !utf8.Valid(b) {
		return nil, &jsonError{off: invalidUTF8At(b), msg: "invalid UTF-8"}
	}
	p := jsonParser{in: b}
	v, err := p.document()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Grow(len(b))
	v.write(&out)
	return out.Bytes(), nil
}

// invalidUTF8At returns the offset of the first byte of b that is not part
// of valid UTF-8, or len(b).
func invalidUTF8At(b []byte) int {
	i := 0
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	return i
}

// jsonError locates a problem in the input; it matches ErrInvalidJSON.
type jsonError struct {
	off int
	msg string
	// spelling marks a value that is well-formed JSON but has no one
	// canonical spelling: invalid UTF-8, an unpaired surrogate escape, an
	// exponent that is too long.
	spelling bool
}

func (e *jsonError) Error() string {
	return fmt.Sprintf("%v at offset %d: %s", ErrInvalidJSON, e.off, e.msg)
}

func (e *jsonError) Is(target error) bool { return target == ErrInvalidJSON }

type jsonKind uint8

const (
	jsonLiteral jsonKind = iota // true, false, null, or a canonical number
	jsonString
	jsonArray
	jsonObject
)

// jsonValue is the parsed document. Objects keep their members sorted.
type jsonValue struct {
	kind    jsonKind
	text    string // literal or number text, or the decoded string
	elems   []jsonValue
	members []jsonMember
}

type jsonMember struct {
	key   string
	at    int // offset of the key in the input, for errors
	value jsonValue
}

// sortMembers orders an object's members by key (byte order of UTF-8 is
// code point order) and rejects a repeated key and keys that differ only in
// case.
func sortMembers(ms []jsonMember) error {
	slices.SortFunc(ms, func(a, b jsonMember) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		return a.at - b.at
	})
	for i := 1; i < len(ms); i++ {
		if ms[i].key == ms[i-1].key {
			return &jsonError{off: ms[i].at, msg: fmt.Sprintf("duplicate key %q", ms[i].key)}
		}
	}
	if len(ms) < 2 {
		return nil
	}
	seen := make(map[string]*jsonMember, len(ms))
	for i := range ms {
		f := foldKey(ms[i].key)
		if prev, ok := seen[f]; ok {
			first, second := prev, &ms[i]
			if second.at < first.at {
				first, second = second, first
			}
			return &jsonError{off: second.at, msg: fmt.Sprintf("keys %q and %q differ only in case", first.key, second.key)}
		}
		seen[f] = &ms[i]
	}
	return nil
}

// foldKey maps every key that Go's encoding/json would match to the same
// struct field (case-insensitively, as bytes.EqualFold compares) to one
// string: each character becomes the smallest of its simple case folding
// orbit (K, k and the Kelvin sign K all become K).
func foldKey(k string) string {
	ascii := true
	for i := 0; i < len(k); i++ {
		if k[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToUpper(k)
	}
	var b strings.Builder
	b.Grow(len(k))
	for _, r := range k {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

type jsonParser struct {
	in  []byte
	pos int
	// field, when set, is the top-level member FieldID reads: a
	// spelling error inside its value is returned as a *fieldError, and
	// strings check their own UTF-8, since nobody checked the whole input
	// first.
	field *string
}

// fieldError is a spelling error inside the value of the top-level member
// that jsonParser.field names. It reads like the error it wraps.
type fieldError struct{ err error }

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// document parses the whole input as one value.
func (p *jsonParser) document() (jsonValue, error) {
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return jsonValue{}, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return jsonValue{}, p.errorf("unexpected %q after the value", p.in[p.pos])
	}
	return v, nil
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return &jsonError{off: p.pos, msg: fmt.Sprintf(format, args...)}
}

// spellingf is errorf for a value that has no one canonical spelling.
func (p *jsonParser) spellingf(format string, args ...any) error {
	return &jsonError{off: p.pos, msg: fmt.Sprintf(format, args...), spelling: true}
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses one value at nesting depth; the caller skipped whitespace.
func (p *jsonParser) value(depth int) (jsonValue, error) {
	if p.pos >= len(p.in) {
		return jsonValue{}, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{' || c == '[':
		if depth >= MaxDepth {
			return jsonValue{}, p.errorf("nesting deeper than %d", MaxDepth)
		}
		if c == '{' {
			return p.object(depth + 1)
		}
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		return jsonValue{kind: jsonString, text: s}, err
	case c == '-' || ('0' <= c && c <= '9'):
		n, err := p.number()
		return jsonValue{kind: jsonLiteral, text: n}, err
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
				p.pos += len(lit)
				return jsonValue{kind: jsonLiteral, text: lit}, nil
			}
		}
		return jsonValue{}, p.errorf("unexpected %q", c)
	}
}

func (p *jsonParser) array(depth int) (jsonValue, error) {
	v := jsonValue{kind: jsonArray}
	p.pos++ // [
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		e, err := p.value(depth)
		if err != nil {
			return jsonValue{}, err
		}
		v.elems = append(v.elems, e)
		p.skipSpace()
		if p.pos >= len(p.in) {
			return jsonValue{}, p.errorf("unexpected end of input in array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return jsonValue{}, p.errorf("want ',' or ']' in array, got %q", p.in[p.pos])
		}
	}
}

func (p *jsonParser) object(depth int) (jsonValue, error) {
	v := jsonValue{kind: jsonObject}
	p.pos++ // {
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return jsonValue{}, p.errorf("want a string key in object")
		}
		keyAt := p.pos
		key, err := p.string()
		if err != nil {
			return jsonValue{}, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return jsonValue{}, p.errorf("want ':' after object key")
		}
		p.pos++
		p.skipSpace()
		e, err := p.value(depth)
		if err != nil {
			if je, ok := err.(*jsonError); ok && je.spelling && depth == 1 && p.field != nil && key == *p.field {
				err = &fieldError{err: err}
			}
			return jsonValue{}, err
		}
		v.members = append(v.members, jsonMember{key: key, at: keyAt, value: e})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return jsonValue{}, p.errorf("unexpected end of input in object")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, sortMembers(v.members)
		default:
			return jsonValue{}, p.errorf("want ',' or '}' in object, got %q", p.in[p.pos])
		}
	}
}

// string decodes the string starting at the opening quote. The input is
// known to be valid UTF-8, unless p.field is set: then string checks it.
func (p *jsonParser) string() (string, error) {
	p.pos++ // opening quote
	var sb strings.Builder
	for {
		start := p.pos
		for p.pos < len(p.in) && p.in[p.pos] != '"' && p.in[p.pos] != '\\' && p.in[p.pos] >= 0x20 {
			p.pos++
		}
		if p.field != nil && !utf8.Valid(p.in[start:p.pos]) {
			p.pos = start + invalidUTF8At(p.in[start:p.pos])
			return "", p.spellingf("invalid UTF-8")
		}
		sb.Write(p.in[start:p.pos])
		if p.pos >= len(p.in) {
			return "", p.errorf("unterminated string")
		}
		switch c := p.in[p.pos]; c {
		case '"':
			p.pos++
			return sb.String(), nil
		case '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			sb.WriteRune(r)
		default:
			return "", p.errorf("control character %#02x in string", c)
		}
	}
}

// escape decodes the escape sequence at the backslash, joining a UTF-16
// surrogate pair into one rune and rejecting an unpaired surrogate.
func (p *jsonParser) escape() (rune, error) {
	if p.pos+1 >= len(p.in) {
		return 0, p.errorf("unterminated escape")
	}
	c := p.in[p.pos+1]
	if c != 'u' {
		var r rune
		switch c {
		case '"', '\\', '/':
			r = rune(c)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		default:
			return 0, p.errorf("invalid escape \\%c", c)
		}
		p.pos += 2
		return r, nil
	}
	r, err := p.hex4()
	if err != nil {
		return 0, err
	}
	if !utf16.IsSurrogate(r) {
		return r, nil
	}
	if r < 0xdc00 && p.pos+1 < len(p.in) && p.in[p.pos] == '\\' && p.in[p.pos+1] == 'u' {
		at := p.pos
		lo, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if pair := utf16.DecodeRune(r, lo); pair != utf8.RuneError {
			return pair, nil
		}
		p.pos = at
	}
	return 0, p.spellingf("unpaired surrogate \\u%04x", r)
}

// hex4 decodes \uXXXX at p.pos.
func (p *jsonParser) hex4() (rune, error) {
	if p.pos+6 > len(p.in) {
		return 0, p.errorf("short \\u escape")
	}
	var r rune
	for _, c := range p.in[p.pos+2 : p.pos+6] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, p.errorf("invalid \\u escape")
		}
	}
	p.pos += 6
	return r, nil
}

// number parses a JSON number and returns its canonical spelling.
func (p *jsonParser) number() (string, error) {
	neg := false
	if p.in[p.pos] == '-' {
		neg = true
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	case p.pos < len(p.in) && '1' <= p.in[p.pos] && p.in[p.pos] <= '9':
		p.skipDigits()
	default:
		return "", p.errorf("want a digit in number")
	}
	intPart := p.in[intStart:p.pos]
	var frac []byte
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		start := p.pos
		if p.skipDigits() == 0 {
			return "", p.errorf("want a digit after '.' in number")
		}
		frac = p.in[start:p.pos]
	}
	exp := int64(0)
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		expNeg := false
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			expNeg = p.in[p.pos] == '-'
			p.pos++
		}
		start := p.pos
		if p.skipDigits() == 0 {
			return "", p.errorf("want a digit in exponent")
		}
		digits := bytes.TrimLeft(p.in[start:p.pos], "0")
		if len(digits) > maxExponentDigits {
			return "", p.spellingf("exponent has more than %d digits", maxExponentDigits)
		}
		if len(digits) > 0 {
			exp, _ = strconv.ParseInt(string(digits), 10, 64) // at most 9 digits: cannot fail
		}
		if expNeg {
			exp = -exp
		}
	}
	out, ok := formatDecimal(neg, intPart, frac, exp)
	if !ok {
		// 1000e999999997 is 1e+1000000000: its canonical spelling would
		// be refused in turn.
		return "", p.spellingf("exponent has more than %d digits in the canonical form", maxExponentDigits)
	}
	return out, nil
}

func (p *jsonParser) skipDigits() int {
	start := p.pos
	for p.pos < len(p.in) && '0' <= p.in[p.pos] && p.in[p.pos] <= '9' {
		p.pos++
	}
	return p.pos - start
}

// formatDecimal writes the exact value (-1)^neg × intPart.frac × 10^exp the
// way ECMAScript's Number::toString lays out digits. It reports false, and
// writes nothing, when that spelling would need an exponent of more than
// maxExponentDigits digits, which Canonical refuses to read.
func formatDecimal(neg bool, intPart, frac []byte, exp int64) (string, bool) {
	digits := make([]byte, 0, len(intPart)+len(frac))
	digits = append(digits, intPart...)
	digits = append(digits, frac...)
	// value = 0.digits × 10^point, before trimming.
	point := int64(len(intPart)) + exp
	lead := len(digits) - len(bytes.TrimLeft(digits, "0"))
	digits = bytes.TrimRight(digits[lead:], "0")
	if len(digits) == 0 {
		return "0", true
	}
	point -= int64(lead)
	k := int64(len(digits))
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch {
	case k <= point && point <= 21:
		b.Write(digits)
		b.WriteString(strings.Repeat("0", int(point-k)))
	case 0 < point && point <= 21:
		b.Write(digits[:point])
		b.WriteByte('.')
		b.Write(digits[point:])
	case -6 < point && point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", int(-point)))
		b.Write(digits)
	case point-1 > maxExponent || point-1 < -maxExponent:
		return "", false
	default:
		b.WriteByte(digits[0])
		if k > 1 {
			b.WriteByte('.')
			b.Write(digits[1:])
		}
		b.WriteByte('e')
		if point-1 >= 0 {
			b.WriteByte('+')
		}
		b.WriteString(strconv.FormatInt(point-1, 10))
	}
	return b.String(), true
}

func (v *jsonValue) write(out *bytes.Buffer) {
	switch v.kind {
	case jsonLiteral:
		out.WriteString(v.text)
	case jsonString:
		writeJSONString(out, v.text)
	case jsonArray:
		out.WriteByte('[')
		for i := range v.elems {
			if i > 0 {
				out.WriteByte(',')
			}
			v.elems[i].write(out)
		}
		out.WriteByte(']')
	case jsonObject:
		out.WriteByte('{')
		for i := range v.members {
			if i > 0 {
				out.WriteByte(',')
			}
			writeJSONString(out, v.members[i].key)
			out.WriteByte(':')
			v.members[i].value.write(out)
		}
		out.WriteByte('}')
	}
}

func writeJSONString(out *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	out.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out.WriteString(s[start:i])
		switch c {
		case '"', '\\':
			out.WriteByte('\\')
			out.WriteByte(c)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			out.WriteString(`\u00`)
			out.WriteByte(hex[c>>4])
			out.WriteByte(hex[c&0xf])
		}
		start = i + 1
	}
	out.WriteString(s[start:])
	out.WriteByte('"')
}
