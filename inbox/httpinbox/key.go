package httpinbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// Claim is the key a running handler owns. The handler reads it with
// FromContext to derive identities that must survive retries.
type Claim struct {
	id        idem.Hash
	tenant    string
	caller    string
	operation string
	key       string
	owner     [16]byte      // lease owner token of this attempt
	expiry    time.Duration // how long the record protects the key
	tombstone time.Duration // how long after expiry it refuses the key; 0: not at all
}

// KeyID returns the stable id of the key's scope: KeyID(tenant, caller,
// operation, key). Use it (or values derived from it) as the event or ledger
// effect identity, so that a retried or re-run request never creates a new
// one.
func (c *Claim) KeyID() string { return c.id.String() }

// Tenant returns the tenant the key belongs to.
func (c *Claim) Tenant() string { return c.tenant }

// Caller returns the caller the key belongs to.
func (c *Claim) Caller() string { return c.caller }

// Operation returns the route's operation.
func (c *Claim) Operation() string { return c.operation }

// Key returns the idempotency key as the client sent it (without quotes).
func (c *Claim) Key() string { return c.key }

type claimKey struct{}

// FromContext returns the claim of the request whose handler ctx belongs to,
// or nil when the request carried no key (a route with KeyOptional) or ctx
// does not come from a Middleware.
func FromContext(ctx context.Context) *Claim {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c
}

// KeyID returns the stable id of (tenant, caller, operation, key): 64 hex
// digits of SHA-256 over the four values, each length-prefixed, so that no
// two scopes share an id. The record's primary key is the same digest.
func KeyID(tenant, caller, operation, key string) string {
	return scopeID(tenant, caller, operation, key).String()
}

func scopeID(tenant, caller, operation, key string) idem.Hash {
	h := sha256.New()
	writeField(h, "idem.httpinbox.key/v1")
	for _, s := range []string{tenant, caller, operation, key} {
		writeField(h, s)
	}
	return idem.Hash(h.Sum(nil))
}

// writeField writes s length-prefixed, so field boundaries are unambiguous.
func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}

var (
	errNoKey  = errors.New("no Idempotency-Key header")
	errBadKey = errors.New("invalid Idempotency-Key")
)

// parseKey returns the key of a request. A key is 1 to max bytes of visible
// ASCII (0x21–0x7E) other than '"' and '\'; it may be sent bare or as a
// structured-field string in double quotes
// (draft-ietf-httpapi-idempotency-key-header). More than one header is
// invalid.
func parseKey(h http.Header, max int) (string, error) {
	vs := h.Values(HeaderKey)
	switch {
	case len(vs) == 0:
		return "", errNoKey
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %d headers", errBadKey, len(vs))
	}
	k := vs[0]
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if err := checkKey(k, max); err != nil {
		return "", fmt.Errorf("%w: %w", errBadKey, err)
	}
	return k, nil
}

// checkKey accepts 1 to max bytes of visible ASCII (0x21–0x7E) other than
// '"' and '\\': the rule for every key idem stores (idempotency keys, webhook
// event ids, bulk item keys).
func checkKey(k string, max int) error {
	if k == "" {
		return errors.New("empty")
	}
	if len(k) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return fmt.Errorf("byte %#02x at %d is not visible ASCII", c, i)
		}
	}
	return nil
}

// validScope reports whether a tenant or caller can be stored as text.
func validScope(s string) bool {
	return len(s) <= maxScopeLength && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// fingerprint is the request's identity for conflict detection: method, route
// template, path, query, tenant, caller, operation and body. A JSON body is
// canonicalised first (key order, whitespace and number spelling do not
// count); any other body, and JSON that has no canonical form (keys that
// differ only in case, which Go decodes by their order), is taken byte for
// byte. Headers never count.
//
// The concrete path and query are included next to the template because
// path parameters are part of what is asked for: the same key and body sent
// to /accounts/1/payments and /accounts/2/payments is a conflict, not a
// replay of account 1's response.
func fingerprint(r *http.Request, template, tenant, caller, operation string, body []byte) idem.Hash {
	h := sha256.New()
	writeField(h, "idem.httpinbox.request/v1")
	query := r.URL.RawQuery
	if q, err := url.ParseQuery(query); err == nil {
		query = q.Encode() // sorted by name
	}
	for _, s := range []string{r.Method, template, r.URL.EscapedPath(), query, tenant, caller, operation} {
		writeField(h, s)
	}
	writeBody(h, body)
	return idem.Hash(h.Sum(nil))
}

// writeBody writes a body to a fingerprint: canonical JSON when it has a
// canonical form, else its bytes, each tagged so the two never collide.
func writeBody(h hash.Hash, body []byte) {
	switch c, err := idem.CanonicalJSON(body); {
	case len(body) == 0:
		writeField(h, "empty")
	case err == nil:
		writeField(h, "json")
		writeField(h, string(c))
	default:
		writeField(h, "raw")
		writeField(h, string(body))
	}
}
