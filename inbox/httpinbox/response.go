package httpinbox

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Response headers the middleware sets.
const (
	// HeaderReplayed is "true" on a response that was stored by an earlier
	// request with the same key.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderResourceID carries Response.ResourceID, on the first response
	// and on every replay, also when the body is not stored.
	HeaderResourceID = "Idempotent-Resource-Id"
)

// Problem codes: the "code" member of the application/problem+json bodies the
// middleware sends. The "type" member is ProblemType(code).
const (
	CodeMissingKey       = "MISSING_IDEMPOTENCY_KEY"
	CodeInvalidKey       = "INVALID_IDEMPOTENCY_KEY"
	CodeInvalidScope     = "INVALID_IDEMPOTENCY_SCOPE"
	CodeKeyReused        = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"
	CodeInProgress       = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	CodeTooManyKeys      = "TOO_MANY_IDEMPOTENCY_KEYS"
	CodeRequestTooLarge  = "REQUEST_TOO_LARGE"
	CodeValidationFailed = "VALIDATION_FAILED"
	CodeInternal         = "INTERNAL_ERROR"
	CodeOutcomeUnknown   = "IDEMPOTENCY_OUTCOME_UNKNOWN"

	// CodeKeyExpired (422) answers a request whose key expired (Expiry)
	// while its tombstone lasts (Config.Tombstone): the stored outcome may
	// have taken effect, so the request neither runs again nor receives
	// the stored response. The client sends a new request with a new key.
	CodeKeyExpired = "IDEMPOTENCY_KEY_EXPIRED"

	// CodeScopeRequired (401) answers a request with a key whose Tenant and
	// Caller are both empty: an anonymous request cannot own a key, or every
	// anonymous caller would receive the others' stored responses.
	CodeScopeRequired = "IDEMPOTENCY_SCOPE_REQUIRED"
)

// Response is what a handler answers. The middleware stores it with the
// record (in the handler's transaction) and sends it; a replay sends the
// stored status, stored headers and body byte for byte.
type Response struct {
	// Status is the HTTP status code. 0 means 200.
	Status int
	// Header holds the response headers. Only those named in
	// Config.StoredHeaders are stored and replayed.
	Header http.Header
	// Body is sent as is.
	Body []byte
	// ResourceID names the resource the request created or changed. It is
	// stored, sent as HeaderResourceID, and kept even when the body is not.
	ResourceID string

	unknown bool
}

// JSON returns a response with status and v encoded as JSON
// (Content-Type application/json).
func JSON(status int, v any) (Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Response{}, fmt.Errorf("httpinbox: encode response: %w", err)
	}
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: b}, nil
}

// problem is an RFC 9457 problem object with a machine-readable code.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

// ProblemType returns the problem "type" URI for code, e.g.
// "urn:idem:problem:missing-idempotency-key".
func ProblemType(code string) string {
	return "urn:idem:problem:" + strings.ToLower(strings.ReplaceAll(code, "_", "-"))
}

// Problem returns an application/problem+json response (RFC 9457) with the
// members type (ProblemType(code)), title (the status text), status, detail
// and code.
func Problem(status int, code, detail string) Response {
	b, _ := json.Marshal(problem{ // a struct of strings and an int always encodes
		Type: ProblemType(code), Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: b}
}

// Unknown marks r as an outcome the handler cannot prove, typically a call
// it made outside the transaction that timed out. The transaction commits, the
// record's state becomes unknown and r is stored and replayed: the request is
// never run again by the middleware (it might have taken effect), and an
// operator can find it by its state. Prefer recording such calls in the
// ledger, which resolves them.
func Unknown(r Response) Response {
	r.unknown = true
	return r
}

// rejection is a handler error whose response is sent but not stored.
type rejection struct {
	resp Response
	err  error
}

func (e *rejection) Error() string {
	if e.err != nil {
		return "httpinbox: request rejected: " + e.err.Error()
	}
	return "httpinbox: request rejected with status " + strconv.Itoa(e.resp.Status)
}

func (e *rejection) Unwrap() error { return e.err }

// problem returns the rejection as a problem object, for the result of a
// bulk item: its own response when that is one, else a VALIDATION_FAILED
// problem with its status.
func (e *rejection) problem() Response {
	if e.resp.Header.Get("Content-Type") == "application/problem+json" && json.Valid(e.resp.Body) {
		return e.resp
	}
	status := e.resp.Status
	if status < 400 || status > 499 {
		status = http.StatusBadRequest
	}
	return Problem(status, CodeValidationFailed, e.Error())
}

// Invalid wraps a validation error. A handler that returns it has its
// transaction rolled back and the key released (deleted), so the client may
// fix the request and retry with the same key; the client receives a 400
// problem with code VALIDATION_FAILED and err's text as detail.
func Invalid(err error) error {
	return &rejection{resp: Problem(http.StatusBadRequest, CodeValidationFailed, err.Error()), err: err}
}

// Reject is Invalid with a response of the handler's choosing: r is sent, not
// stored, the transaction is rolled back and the key released.
func Reject(r Response) error {
	return &rejection{resp: r}
}

// writeResponse sends status, header and body. It is the only way a
// response leaves the middleware, so a first response and its replay differ
// only in the headers that are not stored and HeaderReplayed.
func writeResponse(w http.ResponseWriter, status int, header http.Header, resourceID string, body []byte, replayed bool) {
	h := w.Header()
	for k, vs := range header {
		h[k] = append([]string(nil), vs...)
	}
	if resourceID != "" {
		h.Set(HeaderResourceID, resourceID)
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client went away; the outcome is stored either way
}

func writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter int) {
	p := Problem(status, code, detail)
	if retryAfter > 0 {
		p.Header.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeResponse(w, p.Status, p.Header, "", p.Body, false)
}
