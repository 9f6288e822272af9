package httpinbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// Webhook describes an endpoint that receives a provider's signed events.
// Providers deliver each event at least once and often several times; the
// endpoint keeps one record per (provider, tenant, event id), in the same
// table and with the same guarantees as an Idempotency-Key: the handler runs
// once per event, in the transaction that writes the record, and every
// redelivery is answered with the stored response. A request whose
// signature is missing, wrong or stale is answered 401, and nothing is
// stored or run.
type Webhook struct {
	// Provider names the sender ("stripe", "github", "gateway"): a fixed
	// name, the caller of every event's key. The key's operation is
	// "webhook:" + Provider. Required.
	Provider string
	// Verifier checks the signature before anything in the request is
	// trusted, the event id included: TimestampedHMAC, BodyHMAC, GitHub, or
	// a Verifier of your own. Required.
	Verifier Verifier
	// EventID returns the provider's event id from the verified request:
	// EventIDHeader or EventIDField, or a function of your own. An id must be
	// 1 to Config.MaxKeyLength bytes of visible ASCII; anything else is
	// answered 400. Required.
	EventID EventIDFunc
	// Tenant returns the tenant an event belongs to, read from the verified
	// request (a path value, an account id in the body); it must come from
	// what the signature covers or from the route, like Config.Tenant comes
	// from authentication. Default: none, one key space per provider.
	Tenant func(r *http.Request, body []byte) string
	// Expiry is how long an event id is remembered. It must exceed the
	// provider's retry horizon (Stripe retries for up to 3 days, GitHub
	// does not retry by itself but lets you redeliver for 3 days): a
	// redelivery after it runs the handler again. Default: Config.Expiry.
	Expiry time.Duration
	// Template is the route template in the fingerprint, as Route.Template.
	Template string
	// Tombstone is Config.Tombstone for this endpoint: how long after its
	// Expiry a redelivered event id is refused with 422
	// IDEMPOTENCY_KEY_EXPIRED instead of running again, or NoTombstone. A
	// provider takes the 422 for a failed delivery and retries until its
	// own horizon ends; the handler never runs twice for the event.
	// Default: Config.Tombstone.
	Tombstone time.Duration
}

// EventIDFunc returns the event id of a verified webhook request from its
// headers and raw body.
type EventIDFunc func(header http.Header, body []byte) (string, error)

// ErrNoEventID is returned (wrapped) by EventIDHeader and EventIDField when
// the request carries no event id.
var ErrNoEventID = errors.New("httpinbox: no webhook event id")

// EventIDHeader returns an EventIDFunc that reads header name, such as
// GitHub's X-GitHub-Delivery.
func EventIDHeader(name string) EventIDFunc {
	return func(h http.Header, _ []byte) (string, error) {
		switch vs := h.Values(name); len(vs) {
		case 0:
			return "", fmt.Errorf("%w: no %s header", ErrNoEventID, name)
		case 1:
			return vs[0], nil
		default:
			return "", fmt.Errorf("%w: %d %s headers", ErrNoEventID, len(vs), name)
		}
	}
}

// EventIDField returns an EventIDFunc that reads the string member name of
// a JSON object body, such as the "id" of Stripe's events. The member is
// matched exactly, never case-insensitively.
func EventIDField(name string) EventIDFunc {
	return func(_ http.Header, body []byte) (string, error) {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil {
			return "", fmt.Errorf("%w: the body is not a JSON object: %w", ErrNoEventID, err)
		}
		var id string
		if raw, ok := members[name]; !ok || json.Unmarshal(raw, &id) != nil {
			return "", fmt.Errorf("%w: no string member %q in the body", ErrNoEventID, name)
		}
		return id, nil
	}
}

// Problem codes of the webhook endpoints: 401 for the signature, 400 for
// the event id.
const (
	CodeSignatureMissing = "WEBHOOK_SIGNATURE_MISSING"
	CodeSignatureInvalid = "WEBHOOK_SIGNATURE_INVALID"
	CodeSignatureStale   = "WEBHOOK_SIGNATURE_STALE"
	CodeInvalidEventID   = "INVALID_WEBHOOK_EVENT_ID"
)

// Webhook returns an http.Handler that verifies each request with
// wh.Verifier, takes its event id, and runs h once per (wh.Provider,
// tenant, event id), exactly as Handle runs a handler once per key:
// FromContext(ctx).Key() is the event id and Caller() the provider. A
// redelivered event gets the stored response with Idempotent-Replayed; one
// whose handler is running gets 409 with Retry-After (or waits, with
// Config.Wait); an event id redelivered with another body is a conflict
// (422). Like Handle, it panics on a programming error: no Provider,
// Verifier or EventID, a built-in verifier without secrets, an Expiry not
// above Config.Lease, or a negative Tombstone other than NoTombstone.
func (m *Middleware) Webhook(wh Webhook, h Handler) http.Handler {
	if wh.Expiry == 0 {
		wh.Expiry = m.cfg.Expiry
	}
	var problem error
	switch {
	case wh.Provider == "" || !utf8.ValidString(wh.Provider) || !validScope(wh.Provider):
		problem = errors.New("a valid Provider is required")
	case wh.Verifier == nil || wh.EventID == nil || h == nil:
		problem = errors.New("a Verifier, an EventID function and a handler are required")
	case wh.Expiry <= m.cfg.Lease:
		problem = fmt.Errorf("Expiry %s must exceed the lease %s", wh.Expiry, m.cfg.Lease)
	case wh.Tombstone != 0 && !validTombstone(wh.Tombstone):
		problem = fmt.Errorf("Tombstone %s: want a positive duration, or NoTombstone (-1)", wh.Tombstone)
	}
	if v, ok := wh.Verifier.(interface{ validate() error }); ok && problem == nil {
		problem = v.validate()
	}
	if problem != nil {
		panic(fmt.Sprintf("httpinbox: Webhook %q: %v", wh.Provider, problem))
	}
	route := Route{Operation: "webhook:" + wh.Provider, Template: wh.Template}
	return &endpoint{m: m, route: route, h: h, expiry: wh.Expiry, tombstone: tombstoneOf(wh.Tombstone, m.cfg.Tombstone), webhook: &wh}
}

// serveWebhook verifies the request, then claims its event id.
func (e *endpoint) serveWebhook(w http.ResponseWriter, r *http.Request) {
	m, wh := e.m, e.webhook
	body, ok := e.readBody(w, r)
	if !ok {
		return
	}
	if err := wh.Verifier.Verify(r, body, time.Now()); err != nil {
		e.refuseSignature(w, r, err)
		return
	}
	id, err := wh.EventID(r.Header, body)
	if err == nil {
		err = checkKey(id, m.cfg.MaxKeyLength)
	}
	if err != nil {
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusBadRequest, CodeInvalidEventID, "no usable event id: "+err.Error(), 0)
		return
	}
	tenant := ""
	if wh.Tenant != nil {
		tenant = wh.Tenant(r, body)
	}
	if !validScope(tenant) {
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusBadRequest, CodeInvalidScope, "the tenant must be valid UTF-8 without NUL, at most 255 bytes", 0)
		return
	}
	e.claimAndAnswer(w, r, tenant, wh.Provider, id, body)
}

// refuseSignature answers a request whose signature did not verify.
func (e *endpoint) refuseSignature(w http.ResponseWriter, r *http.Request, err error) {
	code, reason := CodeSignatureInvalid, "invalid"
	switch {
	case errors.Is(err, ErrSignatureMissing):
		code, reason = CodeSignatureMissing, "missing"
	case errors.Is(err, ErrSignatureStale):
		code, reason = CodeSignatureStale, "stale"
	}
	ctx := r.Context()
	decide(ctx, "rejected", nil)
	e.m.metrics.signatureRejected.Add(ctx, 1, e.m.metrics.reasonOpt(e.route.Operation, reason))
	e.m.log.Warn("httpinbox: webhook refused: bad signature", "operation", e.route.Operation, "reason", reason, "error", err)
	writeProblem(w, http.StatusUnauthorized, code, err.Error(), 0)
}
