package httpinbox_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// signatureErr fails unless err is nil or matches exactly one of the
// verifier's sentinels, which the endpoint turns into its 401 codes.
func signatureErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	n := 0
	for _, s := range []error{httpinbox.ErrSignatureMissing, httpinbox.ErrSignatureInvalid, httpinbox.ErrSignatureStale} {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%v matches %d of the signature errors, want 1", err, n)
	}
}

func hmacOf(secret []byte, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, secret)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// withHeader returns a request carrying value in header name.
func withHeader(name, value string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "http://edge.test/webhooks", nil)
	r.Header[http.CanonicalHeaderKey(name)] = []string{value}
	return r
}

// FuzzTimestampedHMAC: whatever a Stripe-style signature header holds,
// Verify answers with one of its three errors or accepts it, and accepts it
// only when a v1 element is the HMAC of "t.body" under the secret and t is
// within the tolerance. What Sign writes verifies, also beside other
// elements; it stops verifying when one byte of the body changes, and is
// stale beyond the tolerance.
func FuzzTimestampedHMAC(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1"}`), "t=1700000000,v1=00", []byte("whsec_1"), int64(1700000000), "v0=abc")
	f.Add([]byte(""), "t=,v1=", []byte("k"), int64(0), "")
	f.Add([]byte("x"), "v1=zz,t=1,t=2", []byte("k"), int64(99999999999), "t=1")
	f.Add([]byte("x"), strings.Repeat("v1=a,", 40), []byte("k"), int64(5), " v1 = ")
	f.Fuzz(func(t *testing.T, body []byte, header string, secret []byte, unix int64, extra string) {
		if len(secret) == 0 {
			secret = []byte("k")
		}
		unix = max(unix, -unix) % 100_000_000_000 // seconds a provider signs: 0 to 11 digits
		at := time.Unix(unix, 0)
		v := &httpinbox.TimestampedHMAC{Header: "Stripe-Signature", Secrets: [][]byte{secret}}

		err := v.Verify(withHeader(v.Header, header), body, at)
		signatureErr(t, err)
		if err == nil && !timestampedMatch(header, secret, body, at) {
			t.Fatalf("accepted %q for %q under %q at %d", header, body, secret, unix)
		}

		signedValue := v.Sign(body, at)
		variants := []string{signedValue, "v0=" + hex.EncodeToString(secret) + "," + signedValue}
		other := strings.ReplaceAll(extra, ",", "")
		if k, _, _ := strings.Cut(strings.TrimSpace(other), "="); k != "t" { // a second t is refused: below
			variants = append(variants, signedValue+","+other, other+","+signedValue)
		}
		for _, h := range variants {
			if err := v.Verify(withHeader(v.Header, h), body, at); err != nil {
				t.Fatalf("its own signature %q of %q: %v", h, body, err)
			}
		}
		if err := v.Verify(withHeader(v.Header, signedValue), append(bytes.Clone(body), 0), at); !errors.Is(err, httpinbox.ErrSignatureInvalid) {
			t.Fatalf("a changed body verifies: %v", err)
		}
		if err := v.Verify(withHeader(v.Header, signedValue+",t="+strconv.FormatInt(unix, 10)), body, at); !errors.Is(err, httpinbox.ErrSignatureInvalid) {
			t.Fatalf("two timestamps verify: %v", err)
		}
		late := at.Add(httpinbox.DefaultTolerance + time.Second)
		if err := v.Verify(withHeader(v.Header, signedValue), body, late); !errors.Is(err, httpinbox.ErrSignatureStale) {
			t.Fatalf("a signature beyond the tolerance: %v", err)
		}
	})
}

// timestampedMatch is the scheme read independently of the verifier: one
// t element of decimal seconds within the default tolerance of now, and a
// v1 element that is the hex HMAC-SHA256 of "t.body".
func timestampedMatch(header string, secret, body []byte, now time.Time) bool {
	var ts string
	var sigs []string
	for _, el := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(el), "=")
		switch k {
		case "t":
			if ts != "" {
				return false
			}
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	n, err := strconv.ParseUint(ts, 10, 63)
	if err != nil || strings.HasPrefix(ts, "+") {
		return false
	}
	if d := now.Sub(time.Unix(int64(n), 0)); d > httpinbox.DefaultTolerance || d < -httpinbox.DefaultTolerance {
		return false
	}
	want := hmacOf(secret, []byte(ts+"."), body)
	for _, s := range sigs {
		if got, err := hex.DecodeString(s); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// FuzzBodyHMAC: whatever a body-signature header (GitHub's, or a generic
// one in hex or base64 after a prefix) holds, Verify answers with one of
// its errors or accepts it, and accepts it only when what follows the
// prefix decodes to the HMAC of the body. What Sign writes verifies, under
// any secret of a rotation, and not for another body.
func FuzzBodyHMAC(f *testing.F) {
	f.Add([]byte(`{"zen":"hi"}`), "sha256=00", "sha256=", false, []byte("s3cret"))
	f.Add([]byte(""), "", "", true, []byte("k"))
	f.Add([]byte("x"), "sha256=", "sha256=", false, []byte("k"))
	f.Add([]byte("x"), "v1,AAAA", "v1,", true, []byte("k"))
	f.Fuzz(func(t *testing.T, body []byte, header, prefix string, b64 bool, secret []byte) {
		if len(secret) == 0 {
			secret = []byte("k")
		}
		v := &httpinbox.BodyHMAC{Header: "X-Signature", Prefix: prefix, Base64: b64, Secrets: [][]byte{[]byte("old"), secret}}
		now := time.Unix(1_700_000_000, 0)

		err := v.Verify(withHeader(v.Header, header), body, now)
		signatureErr(t, err)
		if err == nil {
			enc, ok := strings.CutPrefix(header, prefix)
			decode := hex.DecodeString
			if b64 {
				decode = base64.StdEncoding.DecodeString
			}
			got, derr := decode(enc)
			if !ok || derr != nil || (!hmac.Equal(got, hmacOf(secret, body)) && !hmac.Equal(got, hmacOf([]byte("old"), body))) {
				t.Fatalf("accepted %q for %q (prefix %q, base64 %v)", header, body, prefix, b64)
			}
		}

		rotated := &httpinbox.BodyHMAC{Header: v.Header, Prefix: prefix, Base64: b64, Secrets: [][]byte{secret}}
		signedValue := rotated.Sign(body)
		if strings.TrimSpace(signedValue) == "" {
			t.Fatalf("Sign wrote an empty header")
		}
		if err := v.Verify(withHeader(v.Header, signedValue), body, now); err != nil {
			t.Fatalf("its own signature %q of %q: %v", signedValue, body, err)
		}
		if err := v.Verify(withHeader(v.Header, signedValue), append(bytes.Clone(body), 0), now); !errors.Is(err, httpinbox.ErrSignatureInvalid) {
			t.Fatalf("a changed body verifies: %v", err)
		}
	})
}

// FuzzEventIDField: a webhook's event id is the string member of its JSON
// object body, exactly as encoding/json decodes it; anything else is
// ErrNoEventID. The same event written again with its members in another
// order and other escapes has the same id.
func FuzzEventIDField(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","type":"charge.succeeded"}`), "id")
	f.Add([]byte(`{"ID":"evt_1"}`), "id")
	f.Add([]byte(`{"id":1}`), "id")
	f.Add([]byte(`{"id":"\u0065vt"}`), "id")
	f.Add([]byte(`[]`), "id")
	f.Add([]byte(`{"id":"a","id":"b"}`), "id")
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		id, err := httpinbox.EventIDField(name)(nil, body)
		if err != nil {
			if !errors.Is(err, httpinbox.ErrNoEventID) {
				t.Fatalf("%q: %v is not ErrNoEventID", body, err)
			}
			return
		}
		var members map[string]any
		if json.Unmarshal(body, &members) != nil {
			t.Fatalf("%q: an id %q from a body that is no JSON object", body, id)
		}
		if s, ok := members[name].(string); !ok || s != id {
			t.Fatalf("%q: id %q, member %q is %#v", body, id, name, members[name])
		}
		again, err := json.Marshal(members)
		if err != nil {
			return
		}
		if id2, err := httpinbox.EventIDField(name)(nil, again); err != nil || id2 != id {
			t.Fatalf("%q written again as %q: id %q, then (%q, %v)", body, again, id, id2, err)
		}
	})
}
