package httpinbox

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// statusMux routes GET /operations/{id} as an application mounts
// OperationStatus, and reports what operationIDFrom made of the request.
func statusMux(got func(id string, ok bool)) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /operations/{id}", func(w http.ResponseWriter, r *http.Request) {
		got(operationIDFrom(r))
	})
	return mux
}

// The id of a status request comes from the URL, unescaped, in any bytes a
// client sends: what operationIDFrom accepts is text PostgreSQL stores
// (valid UTF-8, no NUL) without control characters, 1 to 255 bytes, and
// anything else is refused before it reaches the database.
func FuzzOperationIDFromURL(f *testing.F) {
	for _, s := range []string{"op_0123456789abcdef01234567", "%00%ff", "%ff", "a%0Ab", "%C2%85", "%7F", "caf%C3%A9",
		"a%2Fb", "%2E%2E", ".", "%20", strings.Repeat("a", 256), "%E2%80%AE", "x?y=1", "%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, escaped string) {
		req, err := http.NewRequest(http.MethodGet, "http://edge.test/operations/"+escaped, nil)
		if err != nil {
			return // no client can send it
		}
		// A path the mux cleans (redirects) or does not match never reaches
		// the handler.
		statusMux(func(id string, ok bool) {
			if ok != validOperationID(id) {
				t.Fatalf("%q: accepted %v, valid %v", escaped, ok, validOperationID(id))
			}
			if !ok {
				return
			}
			if id == "" || len(id) > maxOperationIDLength || !utf8.ValidString(id) || strings.IndexFunc(id, unicode.IsControl) >= 0 {
				t.Fatalf("%q: accepted the id %q", escaped, id)
			}
		}).ServeHTTP(httptest.NewRecorder(), req)
	})
}

// Every id an operation can have routes back to itself from its default
// Location, whatever its characters.
func FuzzOperationIDRoundTripsThroughItsLocation(f *testing.F) {
	for _, s := range []string{"op_1", "a/b", "a b", "a%2Fb", "..x", "x?y", "x#y", "café", "\u202e", ";", "a\\b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if !validOperationID(id) {
			return
		}
		location := "/operations/" + url.PathEscape(id)
		req, err := http.NewRequest(http.MethodGet, "http://edge.test"+location, nil)
		if err != nil {
			t.Fatalf("%q: its Location %q is no URL: %v", id, location, err)
		}
		var got string
		var ok bool
		rec := httptest.NewRecorder()
		statusMux(func(i string, k bool) { got, ok = i, k }).ServeHTTP(rec, req)
		if !ok || got != id {
			t.Fatalf("%q: Location %q reads back as %q (accepted %v, status %d)", id, location, got, ok, rec.Code)
		}
	})
}

// A key is 1 to max bytes of visible ASCII other than '"' and '\', bare or
// quoted; whatever else a header carries is refused as errBadKey, and a key
// that is accepted is its own canonical spelling.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"k1", `"k1"`, `""`, `"`, "a b", "caf\u00e9", "\x00", strings.Repeat("k", 256), `"a"b"`, `\`, "\"k\\\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := parseKey(http.Header{HeaderKey: {value}}, DefaultMaxKeyLength)
		if err != nil {
			if !errors.Is(err, errBadKey) {
				t.Fatalf("%q: %v is not errBadKey", value, err)
			}
			return
		}
		if cerr := checkKey(key, DefaultMaxKeyLength); cerr != nil {
			t.Fatalf("%q: accepted the key %q: %v", value, key, cerr)
		}
		if value != key && value != `"`+key+`"` {
			t.Fatalf("%q: read as %q", value, key)
		}
		again, err := parseKey(http.Header{HeaderKey: {key}}, DefaultMaxKeyLength)
		if err != nil || again != key {
			t.Fatalf("%q: the key %q reads back as %q, %v", value, key, again, err)
		}
		if _, err := parseKey(http.Header{HeaderKey: {value, value}}, DefaultMaxKeyLength); !errors.Is(err, errBadKey) {
			t.Fatalf("%q twice: %v", value, err)
		}
	})
}

// The scope comes from functions that read the request (in tests, and in
// careless services, from headers): a request whose tenant or caller
// cannot be stored as text is answered 400 INVALID_IDEMPOTENCY_SCOPE, one
// with neither 401 IDEMPOTENCY_SCOPE_REQUIRED, and only a scope that can
// own a key gets through, unchanged.
func FuzzScopeFromHeaders(f *testing.F) {
	f.Add("acme", "alice")
	f.Add("", "")
	f.Add("", "alice")
	f.Add("\x00", "alice")
	f.Add("acme", "\xff")
	f.Add(strings.Repeat("t", 256), "c")
	f.Fuzz(func(t *testing.T, tenant, caller string) {
		e := &endpoint{m: &Middleware{cfg: Config{
			Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") },
			Caller: func(r *http.Request) string { return r.Header.Get("X-Caller") },
		}}}
		req := httptest.NewRequest(http.MethodPost, "/payments", nil)
		req.Header["X-Tenant"] = []string{tenant}
		req.Header["X-Caller"] = []string{caller}
		rec := httptest.NewRecorder()
		gotTenant, gotCaller, ok := e.scope(rec, req)
		switch {
		case ok && (gotTenant != tenant || gotCaller != caller):
			t.Fatalf("(%q, %q) became (%q, %q)", tenant, caller, gotTenant, gotCaller)
		case ok && (!validScope(tenant) || !validScope(caller) || tenant+caller == ""):
			t.Fatalf("(%q, %q) owns keys", tenant, caller)
		case ok:
			return
		case !validScope(tenant) || !validScope(caller):
			wantProblem(t, rec, http.StatusBadRequest, CodeInvalidScope)
		default:
			wantProblem(t, rec, http.StatusUnauthorized, CodeScopeRequired)
		}
	})
}

// Two different scopes never share a key id: the fields are
// length-prefixed, so no shift of bytes between them makes one scope
// another.
func FuzzKeyIDSeparatesScopes(f *testing.F) {
	f.Add("t", "c", "op", "k", "t", "c", "op", "k2")
	f.Add("ab", "c", "op", "k", "a", "bc", "op", "k")
	f.Add("", "c\x00", "op", "k", "c", "\x00", "op", "k")
	f.Fuzz(func(t *testing.T, t1, c1, o1, k1, t2, c2, o2, k2 string) {
		same := t1 == t2 && c1 == c2 && o1 == o2 && k1 == k2
		if (KeyID(t1, c1, o1, k1) == KeyID(t2, c2, o2, k2)) != same {
			t.Fatalf("(%q %q %q %q) and (%q %q %q %q): same scope %v, same id %v", t1, c1, o1, k1, t2, c2, o2, k2,
				same, !same)
		}
	})
}

// wantProblem checks that rec is a problem+json answer with status and code.
func wantProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status || rec.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(rec.Body.String(), `"code":"`+code+`"`) {
		t.Fatalf("got %d %s %s, want %d %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), status, code)
	}
}
