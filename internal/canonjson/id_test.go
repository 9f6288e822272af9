package canonjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/canonjson"
)

// A number id is spelled as Canonical writes the number, so every
// spelling of one value is one id.
func TestNumberIDSpelledAnyWayIsOneID(t *testing.T) {
	t.Parallel()
	for want, spellings := range map[string][]string{
		"1000":                 {"1000", "1000.0", "1e3", "1E3", "10e2", "1E+3", "1000e0", "10000e-1", "0.1e4", "1000.000"},
		"0":                    {"0", "-0", "0.0", "-0e10", "0e-99999"},
		"-12.5":                {"-12.50", "-1.25e1", "-125e-1"},
		"1e+21":                {"1e21", "10e20", "1000000000000000000000"},
		"12345678901234567891": {"12345678901234567891", "1.2345678901234567891e19"},
		"1e-7":                 {"1e-7", "0.0000001", "0.1e-6"},
	} {
		for _, n := range spellings {
			id, err := canonjson.FieldID(fmt.Appendf(nil, `{"amount":5,"invoiceId":%s}`, n), "invoiceId")
			require.NoError(t, err, n)
			require.Equal(t, want, id, n)
			canonical, err := canonjson.Canonical([]byte(n))
			require.NoError(t, err, n)
			require.Equal(t, string(canonical), id, "the id of %s is its spelling in the hashed form", n)
		}
	}
}

// A string id is its decoded content, exactly: the string "1000" is the
// same id as the number 1000 (their payloads hash differently, so one is a
// conflict of the other), while the string "1e3" stays 1e3.
func TestStringIDIsItsDecodedContent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ value, want string }{
		{`"1000"`, "1000"},
		{`"1e3"`, "1e3"},
		{`"1000.0"`, "1000.0"},
		{`"inv-7"`, "inv-7"},
		{`"\u0041BC"`, "ABC"},
		{`"a\/b"`, "a/b"},
		{`"\ud83d\ude00"`, "😀"},
		{`" x "`, " x "},
	} {
		id, err := canonjson.FieldID([]byte(`{"invoiceId":`+tc.value+`}`), "invoiceId")
		require.NoError(t, err, tc.value)
		require.Equal(t, tc.want, id, tc.value)
	}
	a, err := canonjson.Canonical([]byte(`{"invoiceId":"1000"}`))
	require.NoError(t, err)
	b, err := canonjson.Canonical([]byte(`{"invoiceId":1000}`))
	require.NoError(t, err)
	require.NotEqual(t, a, b, "the string and the number are different payloads: one id, a conflict")
}

func TestMissingNullOrEmptyIDFieldIsNoID(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"other":1}`, `{"invoiceId":null}`, `{"invoiceId":""}`, `{"InvoiceId":"x"}`, `{"a":{"invoiceId":"x"}}`} {
		id, err := canonjson.FieldID([]byte(body), "invoiceId")
		require.NoError(t, err, body)
		require.Empty(t, id, body)
	}
}

// An id field whose value has no one spelling is refused as an invalid id,
// never repaired: "a\xff" and "a\xfe" must not both become "a\ufffd".
func TestIDFieldWithNoOneSpellingIsRefusedNeverRepaired(t *testing.T) {
	t.Parallel()
	for _, value := range []string{
		"\"a\xff\"", "\"a\xfe\"", "\"\xc3\"", "\"\xed\xa0\x80\"", // invalid UTF-8, an encoded surrogate
		`"a\ud800"`, `"\udc00b"`, `"\ud800\u0041"`, // unpaired surrogate escapes
		`"a\u0000b"`, "\"a\\u0000\"", // NUL
		`1e1234567890`, `-1e-00000000001234567890`, // an exponent canonical JSON refuses
		`1000e999999997`, `0.0001e-999999996`, // an exponent canonical JSON would have to write
		`true`, `false`, `[1]`, `{"n":1}`, `[]`, "[\"\xff\"]",
	} {
		for _, body := range []string{`{"invoiceId":` + value + `,"amount":5}`, `{"amount":5,"invoiceId":` + value + `}`} {
			id, err := canonjson.FieldID([]byte(body), "invoiceId")
			require.ErrorIs(t, err, canonjson.ErrInvalidID, "%q", body)
			require.Empty(t, id)
		}
	}
	_, err := canonjson.FieldID([]byte("{\"invoiceId\":\"a\xff\"}"), "invoiceId")
	require.EqualError(t, err, `idem: invalid id: field "invoiceId": idem: invalid JSON at offset 15: invalid UTF-8`)
	_, err = canonjson.FieldID([]byte(`{"invoiceId":"a\ud800"}`), "invoiceId")
	require.EqualError(t, err, `idem: invalid id: field "invoiceId": idem: invalid JSON at offset 21: unpaired surrogate \ud800`)
}

// A body Canonical refuses for another reason than its id's spelling
// is refused too (its meaning, so its id, is unclear), but not as an
// invalid id: a syntax error, in the id's value too, is the body's.
func TestIDFromABodyCanonicalJSONRefusesIsRefused(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		"{\"invoiceId\":\"a\",\"note\":\"\xff\"}", "{\"note\xff\":1,\"invoiceId\":\"a\"}",
		`{"invoiceId":"a","note":"\ud800"}`, `{"invoiceId":"a","n":1e1234567890}`,
		`{"invoiceId":"a","invoiceId":"b"}`, `{"invoiceId":"a","InvoiceId":"a"}`, `{"invoiceId":1,"amt":1,"AMT":2}`,
		`{"invoiceId":"a"`, `{"invoiceId":"a"} x`, `{"invoiceId":"a","n":01}`, ``, "\xff{\"invoiceId\":\"a\"}",
		`{"invoiceId":01}`, `{"invoiceId":1.}`, `{"invoiceId":"abc`, `{"invoiceId":tru}`, `{"invoiceId":"\x"}`, `{"invoiceId":}`,
	} {
		_, err := canonjson.FieldID([]byte(body), "invoiceId")
		require.ErrorIs(t, err, canonjson.ErrInvalidJSON, "%q", body)
		require.NotErrorIs(t, err, canonjson.ErrInvalidID, "%q", body)
		_, err = canonjson.Canonical([]byte(body))
		require.Error(t, err, "%q: the premise, canonical JSON refuses it", body)
	}
	for _, body := range []string{`"a"`, `[{"invoiceId":"a"}]`, `1000`, `null`} {
		_, err := canonjson.FieldID([]byte(body), "invoiceId")
		require.ErrorIs(t, err, canonjson.ErrInvalidJSON, "%q is not an object", body)
		require.NotErrorIs(t, err, canonjson.ErrInvalidID, "%q", body)
	}
}

func TestCheckIDRefusesWhatIsNotText(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a", "inv-1000", "é😀", "\u2028", strings.Repeat("x", 1000)} {
		require.NoError(t, canonjson.CheckID(id), "%q", id)
	}
	for _, id := range []string{"a\xff", "\xfe", "\xed\xa0\x80", "a\x00", "\x00"} {
		require.ErrorIs(t, canonjson.CheckID(id), canonjson.ErrInvalidID, "%q", id)
	}
	require.EqualError(t, canonjson.CheckID("ab\xff"), "idem: invalid id: invalid UTF-8 at byte 2")
	require.EqualError(t, canonjson.CheckID("a\x00"), "idem: invalid id: NUL at byte 1")
}

// FuzzJSONFieldID checks that two bodies with one canonical form give one id
// or are both refused the same way, that an id is always text the inbox
// takes, and that a body Canonical refuses never gives an id.
func FuzzJSONFieldID(f *testing.F) {
	for _, s := range []string{
		`{"invoiceId":1000,"amount":5}`, `{"amount":5,"invoiceId":1e3}`, `{"invoiceId":"1000"}`,
		`{"invoiceId":"a\ud800"}`, "{\"invoiceId\":\"a\xff\"}", `{"invoiceId":1e1234567890}`, `{"invoiceId":null}`,
		`{"invoiceId":"<\u0041>","n":[1,2]}`, `{"invoiceId":[1]}`, `{}`,
	} {
		f.Add([]byte(s), "invoiceId")
	}
	f.Fuzz(func(t *testing.T, body []byte, field string) {
		id, err := canonjson.FieldID(body, field)
		if err == nil && (!utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0) {
			t.Fatalf("id %q of %q is not text an id can be", id, body)
		}
		if err != nil && !errors.Is(err, canonjson.ErrInvalidID) && !errors.Is(err, canonjson.ErrInvalidJSON) {
			t.Fatalf("error %v matches neither ErrInvalidID nor ErrInvalidJSON", err)
		}
		canonical, cerr := canonjson.Canonical(body)
		if cerr != nil {
			if err == nil {
				t.Fatalf("id %q from %q, which canonical JSON refuses: %v", id, body, cerr)
			}
			return
		}
		sameID(t, body, canonical, field, id, err)
		if respelled, ok := respell(canonical); ok {
			sameID(t, body, respelled, field, id, err)
		}
	})
}

// sameID fails unless other gives id and err as body did: the same id, or
// the same kind of refusal.
func sameID(t *testing.T, body, other []byte, field, id string, err error) {
	t.Helper()
	id2, err2 := canonjson.FieldID(other, field)
	if id != id2 || (err == nil) != (err2 == nil) || errors.Is(err, canonjson.ErrInvalidID) != errors.Is(err2, canonjson.ErrInvalidID) {
		t.Fatalf("one canonical value, two answers: %q -> (%q, %v), %q -> (%q, %v)", body, id, err, other, id2, err2)
	}
}

// respell writes the value of b again with encoding/json: other escapes
// (\u003c for <), keys in another order, numbers unchanged.
func respell(b []byte) ([]byte, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil, false
	}
	out, err := json.Marshal(v)
	return out, err == nil
}
