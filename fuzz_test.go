package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/idemkit/idem"
)

// FuzzHashJSON: the payload hash a consumer with HashCanonicalJSON stores
// is the SHA-256 of CanonicalJSON, and it does not change when a producer
// writes the same document again: indented, compacted, or re-encoded by
// encoding/json (members reordered, <>& escaped as \u003c…). What it
// refuses is idem.ErrInvalidJSON, from both functions alike.
func FuzzHashJSON(f *testing.F) {
	for _, s := range []string{
		`{"amount": 12.50, "currency":"EUR"}`, `{"currency":"EUR","amount":1.25e1}`, `[1000, 1000.0, 1e3, 10E2]`,
		`{"a":"<&>","b":"\u00e9\ud83d\ude00"}`, `{"amt":1,"AMT":2}`, `{"a":1,"a":1}`, "\"\xff\"", `"\ud800"`, `1e1234567890`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := idem.HashJSON(in)
		c, cerr := idem.CanonicalJSON(in)
		if (err == nil) != (cerr == nil) {
			t.Fatalf("%q: HashJSON says %v, CanonicalJSON %v", in, err, cerr)
		}
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidJSON) || !errors.Is(cerr, idem.ErrInvalidJSON) {
				t.Fatalf("%q: refused with %v and %v, not idem.ErrInvalidJSON", in, err, cerr)
			}
			return
		}
		if h != idem.HashBytes(c) {
			t.Fatalf("%q: HashJSON is not the hash of its canonical form %q", in, c)
		}
		var indented, compacted bytes.Buffer
		if json.Indent(&indented, in, "", "\t") != nil || json.Compact(&compacted, in) != nil {
			t.Fatalf("%q: accepted, but encoding/json cannot reformat it", in)
		}
		spellings := [][]byte{indented.Bytes(), compacted.Bytes(), c}
		d := json.NewDecoder(bytes.NewReader(in))
		d.UseNumber()
		var v any
		if d.Decode(&v) == nil {
			if again, err := json.Marshal(v); err == nil {
				spellings = append(spellings, again)
			}
		}
		for _, s := range spellings {
			if h2, err := idem.HashJSON(s); err != nil || h2 != h {
				t.Fatalf("%q and %q are one document, hashed %v and %v (%v)", in, s, h, h2, err)
			}
		}
	})
}
