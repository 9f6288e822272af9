package httpinbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem"
)

// FuzzBulkItems: a bulk command's body is {"items":[…]}, each item an
// object with a string "key". Whatever a client sends, parse refuses it
// with a 400 or a 413 or gives 1 to MaxItems items with distinct valid
// keys, each claimed in the request's scope under its own key; the items
// sent again in the reverse order, each re-encoded, are the same items
// with the same fingerprints.
func FuzzBulkItems(f *testing.F) {
	for _, s := range []string{
		`{"items":[{"key":"a","amount":1},{"key":"b","amount":2}]}`, `{"items":[{"key":"a"},{"key":"a"}]}`,
		`{"items":[{"key":"\u0041"},{"key":"A"}]}`, `{"items":[]}`, `{"items":[{"key":1}]}`, `{"items":[{"key":"a b"}]}`,
		`{"items":[{"key":"a"}],"more":1}`, `{"items":[{"key":"a","KEY":"b"}]}`, `[{"key":"a"}]`,
		`{"items":[{"key":"a"},{"key":"b"},{"key":"c"},{"key":"d"},{"key":"e"},{"key":"f"}]}`,
	} {
		f.Add([]byte(s))
	}
	b := &bulk{m: &Middleware{cfg: Config{MaxKeyLength: DefaultMaxKeyLength}}, cfg: Bulk{ItemOperation: "payment", MaxItems: 5}}
	ctx := context.WithValue(context.Background(), claimKey{}, &Claim{tenant: "acme", caller: "alice"})
	parse := func(body []byte) ([]bulkItem, error) {
		return b.parse(ctx, httptest.NewRequest(http.MethodPost, "/payments/bulk", bytes.NewReader(body)))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, err := parse(body)
		if err != nil {
			var r *rejection
			if !errors.As(err, &r) || (r.resp.Status != http.StatusBadRequest && r.resp.Status != http.StatusRequestEntityTooLarge) {
				t.Fatalf("%q: refused with %v, not a 400 or 413", body, err)
			}
			return
		}
		if len(items) == 0 || len(items) > b.cfg.MaxItems {
			t.Fatalf("%q: %d items", body, len(items))
		}
		keys := map[string]bool{}
		again := make([]json.RawMessage, len(items))
		for i, it := range items {
			k := it.claim.key
			if checkKey(k, DefaultMaxKeyLength) != nil || keys[k] {
				t.Fatalf("%q: item %d has the key %q (invalid or repeated)", body, i, k)
			}
			keys[k] = true
			if it.claim.id != scopeID("acme", "alice", "payment", k) || it.claim.operation != "payment" {
				t.Fatalf("%q: item %q claimed as %+v", body, k, it.claim)
			}
			var members map[string]any
			d := json.NewDecoder(bytes.NewReader(it.raw))
			d.UseNumber()
			if d.Decode(&members) != nil || members[ItemKeyMember] != k {
				t.Fatalf("%q: item %d is %q, its key %q", body, i, it.raw, k)
			}
			again[len(items)-1-i], _ = json.Marshal(members)
		}
		respelt, _ := json.Marshal(map[string]any{"items": again})
		items2, err := parse(respelt)
		if err != nil || len(items2) != len(items) {
			t.Fatalf("%q sent again as %q: %d items, %v", body, respelt, len(items2), err)
		}
		for i, it := range items2 {
			first := items[len(items)-1-i]
			_, cerr := idem.CanonicalJSON(first.raw) // without a canonical form, its bytes are its identity
			if it.claim.key != first.claim.key || (it.fp != first.fp && cerr == nil) {
				t.Fatalf("%q sent again as %q: item %q is another item", body, respelt, it.claim.key)
			}
		}
	})
}
