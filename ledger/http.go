package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// HTTPExecutor sends each effect's request as a JSON body to the effect's
// Target URL, with the effect's idempotency key in the Idempotency-Key
// header and the effect's trace context in the traceparent header. It
// classifies the answer by what it proves (see docs/ledger.md):
//
//   - 2xx: succeeded.
//   - 408, 425 and 429 (the request was refused before it was acted on),
//     503 with Retry-After (the origin declares itself unavailable), and an
//     error before anything was sent (DNS, connection refused, TLS):
//     failed_retryable, honouring Retry-After.
//   - 409 with Retry-After or the problem code
//     IDEMPOTENCY_REQUEST_IN_PROGRESS: the target holds an earlier request
//     under this key; unknown with Result.InProgress, so it is asked again
//     later with the same key.
//   - 3xx, 501, 505 and other 4xx: failed_terminal.
//   - 500, 502, 504, 503 without Retry-After and every other 5xx (a
//     gateway answers them after its upstream may have acted), and no
//     answer after the request started to leave (a timeout, a reset):
//     unknown.
//
// The zero value is usable. Its fields must not change once it is in use.
type HTTPExecutor struct {
	// Client sends the requests. Default: a client with a 30 second timeout.
	Client *http.Client
	// Deduplicates says the target performs a request at most once per
	// Idempotency-Key, so unknown outcomes may be retried with the same key.
	Deduplicates bool
	// Header is added to every request (e.g. Authorization).
	Header http.Header
	// Method is the HTTP method. Default: POST.
	Method string
}

var defaultHTTPClient = &http.Client{Timeout: 30 * time.Second}

// noRedirects is what Execute does with any client: a redirect is answered,
// not followed. Following one would turn the POST into a GET without a body
// and count its 200 as the effect's success.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// DeduplicatesByKey returns e.Deduplicates.
func (e *HTTPExecutor) DeduplicatesByKey() bool { return e.Deduplicates }

// maxResponseRead bounds how much of a response is read (and hashed).
const maxResponseRead = 1 << 20

// Execute sends call's request to call.Target, in an HTTP client span whose
// context it sends in the traceparent header (and whatever else the
// application's propagator writes), so the target continues the effect's
// trace.
func (e *HTTPExecutor) Execute(ctx context.Context, call Call) (Result, error) {
	method := e.Method
	if method == "" {
		method = http.MethodPost
	}
	spanName, attrs := tracing.HTTPMethod(method)
	attrs = append(attrs, targetAttrs(call.Target)...)
	if call.Attempt > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCount(call.Attempt-1))
	}
	ctx, span := startCallSpan(ctx, spanName, trace.SpanKindClient, attrs...)
	res, code, err := e.send(ctx, method, call)
	errorType := ""
	switch {
	case code > 0:
		span.SetAttributes(semconv.HTTPResponseStatusCode(code))
		errorType = strconv.Itoa(code)
	case err != nil:
		errorType = semconv.ErrorType(err).Value.AsString()
	}
	endCallSpan(span, res, errorType, err)
	return res, err
}

// send sends the request and classifies the answer; code is the response's
// status, 0 when none arrived.
func (e *HTTPExecutor) send(ctx context.Context, method string, call Call) (res Result, code int, err error) {
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaderField: func(string, []string) { sent.Store(true) },
	})
	req, err := e.newRequest(ctx, method, call)
	if err != nil {
		return Result{Status: StatusFailedTerminal}, 0, err
	}
	client := e.Client
	if client == nil {
		client = defaultHTTPClient
	}
	c := *client
	c.CheckRedirect = noRedirects
	resp, err := c.Do(req)
	if err != nil {
		if !sent.Load() {
			return Result{Status: StatusFailedRetryable}, 0, fmt.Errorf("ledger: http %s: not sent: %w", call.EffectID, err)
		}
		return Result{Status: StatusUnknown}, 0, fmt.Errorf("ledger: http %s: no answer after sending: %w", call.EffectID, err)
	}
	defer resp.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResponseRead))
	res = Result{Response: body}
	code = resp.StatusCode
	res.Status, res.RetryAfter, res.InProgress = classifyHTTP(code, resp.Header, body, time.Now())
	if res.Status == StatusSucceeded {
		return res, code, nil
	}
	err = fmt.Errorf("ledger: http %s: %s", call.EffectID, resp.Status)
	if readErr != nil {
		err = errors.Join(err, fmt.Errorf("read body: %w", readErr))
	}
	return res, code, err
}

// inProgressCodes are the problem codes with which a target answers 409 to
// a request whose idempotency key an unfinished request holds: idem's own
// HTTP edge (package httpinbox) and Stripe's.
var inProgressCodes = [...]string{"IDEMPOTENCY_REQUEST_IN_PROGRESS", "idempotency_key_in_use"}

// classifyHTTP is the status an answer with status code code leaves an
// effect in, what it asks with Retry-After, and whether it says an earlier
// request under the same key is still in progress. Only an answer that
// proves the request was not acted on is retryable for a target that does
// not deduplicate; an answer that proves nothing is unknown.
func classifyHTTP(code int, h http.Header, body []byte, now time.Time) (Status, time.Duration, bool) {
	after := retryAfter(h.Get("Retry-After"), now)
	switch {
	case code >= 200 && code < 300:
		return StatusSucceeded, 0, false
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return StatusFailedRetryable, after, false
	case code == http.StatusServiceUnavailable && h.Get("Retry-After") != "":
		return StatusFailedRetryable, after, false
	case code == http.StatusConflict && (h.Get("Retry-After") != "" || saysInProgress(body)):
		return StatusUnknown, after, true
	case code == http.StatusNotImplemented, code == http.StatusHTTPVersionNotSupported:
		return StatusFailedTerminal, 0, false // the server cannot handle the request at all
	case code >= 500:
		return StatusUnknown, after, false
	default: // 1xx, 3xx and 4xx: an answer that refuses the request
		return StatusFailedTerminal, 0, false
	}
}

// saysInProgress reports whether body is a problem document (RFC 9457, or
// an error object as Stripe's) whose code is one of inProgressCodes.
func saysInProgress(body []byte) bool {
	var p struct {
		Code  string `json:"code"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &p) != nil {
		return false
	}
	for _, c := range inProgressCodes {
		if p.Code == c || p.Error.Code == c {
			return true
		}
	}
	return false
}

// newRequest builds the request of call, with the executor's headers, the
// idempotency key and the trace context of ctx.
func (e *HTTPExecutor) newRequest(ctx context.Context, method string, call Call) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, call.Target, bytes.NewReader(call.Request))
	if err != nil {
		return nil, fmt.Errorf("ledger: http %s: build request: %w", call.EffectID, err)
	}
	if !e.Deduplicates {
		// Without GetBody, and with a body that is not http.NoBody (which
		// the transport treats as replayable), the transport cannot resend
		// the request by itself on a broken keep-alive connection; only the
		// ledger decides on resending, and only to targets that deduplicate.
		req.GetBody = nil
		req.Body = io.NopCloser(bytes.NewReader(call.Request))
	}
	for k, vs := range e.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Idempotency-Key", call.IdempotencyKey)
	tracing.Propagator(nil).Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req, nil
}

// targetAttrs returns url.full (without credentials and query values, which
// may hold secrets), server.address and server.port of target.
func targetAttrs(target string) []attribute.KeyValue {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return nil
	}
	port := 0
	switch u.Scheme {
	case "http":
		port = 80
	case "https":
		port = 443
	}
	attrs := tracing.ServerAddress(u.Host, port)
	r := *u
	if r.User != nil {
		r.User = url.UserPassword("REDACTED", "REDACTED")
	}
	if r.RawQuery != "" {
		q := r.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		r.RawQuery = q.Encode()
	}
	return append(attrs, semconv.URLFull(r.String()))
}

// maxRetryAfter caps what a target may ask for with Retry-After.
const maxRetryAfter = 24 * time.Hour

// retryAfter parses a Retry-After header: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return min(time.Duration(min(s, int(maxRetryAfter/time.Second)))*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}
