package canonjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/canonjson"
)

func TestCanonicalJSONNormalisesNumbersExactly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"1", "1"}, {"1.0", "1"}, {"1e0", "1"}, {"10e-1", "1"}, {"0.1e1", "1"}, {"1.000E+0", "1"},
		{"-0", "0"}, {"0.000", "0"}, {"-0e10", "0"}, {"0e-99999", "0"},
		{"100", "100"}, {"1e2", "100"}, {"1E+02", "100"}, {"1e0000000000002", "100"},
		{"-12.50", "-12.5"}, {"0.5", "0.5"}, {"5e-1", "0.5"},
		{"0.000001", "0.000001"}, {"1e-7", "1e-7"}, {"0.0000001234", "1.234e-7"},
		{"123456789012345678901", "123456789012345678901"}, {"1e21", "1e+21"}, {"12e20", "1.2e+21"},
		// Exact: never rounded through float64.
		{"12345678901234567890", "12345678901234567890"},
		{"12345678901234567891", "12345678901234567891"},
		{"0.1000000000000000000000000001", "0.1000000000000000000000000001"},
		{"1e400", "1e+400"}, {"-1.5e-400", "-1.5e-400"},
		// The longest exponents the canonical form writes.
		{"1000e999999996", "1e+999999999"}, {"0.001e-999999996", "1e-999999999"},
	} {
		got, err := canonjson.Canonical([]byte(tc.in))
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
	}
}

func TestCanonicalJSONKeepsStringContentExactly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`"a\/b"`, `"a/b"`},
		{`"\u00e9"`, `"é"`},
		{`"é"`, `"é"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\"\\\b\f\n\r\t"`, `"\"\\\b\f\n\r\t"`},
		{`"\u0000\u001F\u007f"`, "\"\\u0000\\u001f\x7f\""},
		{`"<&> \u2028"`, "\"<&> \u2028\""},
		{`{"b":1,"a":2,"é":3,"z":4,"😀":5}`, `{"a":2,"b":1,"z":4,"é":3,"😀":5}`},
	} {
		got, err := canonjson.Canonical([]byte(tc.in))
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
	}
}

func TestCanonicalJSONRejectsWhatItCannotCanonicalise(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", canonjson.MaxDepth+1) + strings.Repeat("]", canonjson.MaxDepth+1)
	for _, in := range []string{
		``, ` `, `{`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `[1 2]`, `01`, `1.`, `.5`, `+1`, `1e`, `-`,
		`NaN`, `Infinity`, `tru`, `nul`, `"abc`, "\"a\tb\"", `"\x"`, `"\u12"`, `"\uzzzz"`,
		`1 2`, `{} {}`, "\xef\xbb\xbf{}",
		"\"\xff\"", "{\"k\xc3\":1}", `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`,
		`{"a":1,"a":1}`, `{"a":1,"b":{"c":1,"c":2}}`,
		`1e1234567890`, `1e-0000012345678901`,
		// Exponents of 9 digits as written, of 10 once canonical: the
		// output would not read back.
		`1000e999999997`, `-0.0001e-999999996`, `12345678901e999999990`,
		deep,
	} {
		_, err := canonjson.Canonical([]byte(in))
		require.ErrorIs(t, err, canonjson.ErrInvalidJSON, "%q", in)
	}
	ok := strings.Repeat("[", canonjson.MaxDepth) + strings.Repeat("]", canonjson.MaxDepth)
	_, err := canonjson.Canonical([]byte(ok))
	require.NoError(t, err, "depth exactly MaxDepth is allowed")
}

func TestCanonicalJSONErrorsSayWhere(t *testing.T) {
	t.Parallel()
	_, err := canonjson.Canonical([]byte(`{"a":1,"a":2}`))
	require.EqualError(t, err, `idem: invalid JSON at offset 7: duplicate key "a"`)
	_, err = canonjson.Canonical([]byte("[1,\"\xff\"]"))
	require.EqualError(t, err, `idem: invalid JSON at offset 4: invalid UTF-8`)
}

// Go's encoding/json fills a struct field from any spelling of its name, and
// the last one wins: two documents that differ only in the order of "amt"
// and "AMT" decode to different values, so they must never canonicalise
// (and so fingerprint or hash) alike.
func TestCanonicalJSONRefusesKeysThatDifferOnlyInCase(t *testing.T) {
	t.Parallel()
	var a, b struct {
		Amt int `json:"amt"`
	}
	require.NoError(t, json.Unmarshal([]byte(`{"amt":1,"AMT":2}`), &a))
	require.NoError(t, json.Unmarshal([]byte(`{"AMT":2,"amt":1}`), &b))
	require.NotEqual(t, a, b, "the premise: Go decodes them differently")

	for _, in := range []string{
		`{"amt":1,"AMT":2}`, `{"AMT":2,"amt":1}`, `{"a":{"Id":1,"iD":2}}`, `[{"x":1},{"k":1,"\u212a":2}]`,
		`{"s":1,"\u017f":2}`, `{"Straße":1,"STRASSE":2,"straße":3}`,
	} {
		_, err := canonjson.Canonical([]byte(in))
		require.ErrorIs(t, err, canonjson.ErrInvalidJSON, in)
	}
	_, err := canonjson.Canonical([]byte(`{"amt":1,"AMT":2}`))
	require.EqualError(t, err, `idem: invalid JSON at offset 9: keys "amt" and "AMT" differ only in case`)

	// Keys that Go keeps apart stay allowed.
	for _, in := range []string{`{"amt":1,"amt_":2}`, `{"a-b":1,"a_b":2}`, `{"Straße":1,"STRASSE":2}`, `{"":1,"a":2}`} {
		_, err := canonjson.Canonical([]byte(in))
		require.NoError(t, err, in)
	}
}

// FuzzCanonicalJSON checks that Canonical never panics, accepts only valid
// JSON, produces valid JSON that canonicalises to itself, and keeps the
// meaning of the document (as encoding/json reads it).
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,"x"]}`, `1.0`, `-0.0e-0`, `"\ud83d\ude00\u0000"`, `[]`, `{}`, `[[[]]]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := canonjson.Canonical(in)
		if err != nil {
			if !errors.Is(err, canonjson.ErrInvalidJSON) {
				t.Fatalf("error %v does not match ErrInvalidJSON", err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("accepted input that encoding/json rejects: %q", in)
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q -> %q", in, out)
		}
		again, err := canonjson.Canonical(out)
		if err != nil {
			t.Fatalf("canonical output rejected: %q: %v", out, err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}
		var vin, vout any
		if json.Unmarshal(in, &vin) == nil {
			if err := json.Unmarshal(out, &vout); err != nil {
				t.Fatalf("encoding/json reads the input but not the output %q: %v", out, err)
			}
			if !reflect.DeepEqual(vin, vout) {
				t.Fatalf("meaning changed: %q (%v) -> %q (%v)", in, vin, out, vout)
			}
		}
	})
}
