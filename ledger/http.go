package ledger

import (
	"bytes"
	"context"
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
// classifies the answer:
//
//   - 2xx: succeeded.
//   - 409 Conflict, 422 Unprocessable Entity and other 4xx: failed_terminal.
//   - 408, 425, 429 and 5xx: failed_retryable, honouring Retry-After.
//   - no answer after the request started to leave (a timeout, a reset):
//     unknown.
//   - an error before anything was sent (DNS, connection refused, TLS):
//     failed_retryable.
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
	switch {
	case code >= 200 && code < 300:
		res.Status = StatusSucceeded
		return res, code, nil
	case code >= 300 && code < 400:
		res.Status = StatusFailedTerminal // a redirect: the target is misconfigured, nothing was done
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests, code >= 500:
		res.Status = StatusFailedRetryable
		res.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	default:
		res.Status = StatusFailedTerminal
	}
	err = fmt.Errorf("ledger: http %s: %s", call.EffectID, resp.Status)
	if readErr != nil {
		err = errors.Join(err, fmt.Errorf("read body: %w", readErr))
	}
	return res, code, err
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
