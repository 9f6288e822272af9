package httpinbox

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// idem's attributes on the server span.
const (
	attrOperation = attribute.Key("idem.http.operation")
	attrKeyID     = attribute.Key("idem.http.key_id")
	// attrDecision is what the middleware did with the request: run,
	// replayed, conflict, in_progress, limited or rejected (a request
	// without a valid key or scope).
	attrDecision = attribute.Key("idem.http.decision")
)

// exchange is one request as the telemetry sees it.
type exchange struct {
	start  time.Time
	span   trace.Span
	method string // the method as the convention names it
	route  string
	scheme string
	w      *statusWriter
}

// startSpan starts the server span of r, continuing the trace of an
// incoming traceparent (or whatever the propagator reads), and returns the
// request with the span in its context and a writer that notes the status.
func (e *endpoint) startSpan(w http.ResponseWriter, r *http.Request) (*exchange, http.ResponseWriter, *http.Request) {
	x := &exchange{start: time.Now(), route: e.route.Template, scheme: "http", w: &statusWriter{ResponseWriter: w}}
	if x.route == "" {
		x.route = routeOf(r.Pattern)
	}
	if r.TLS != nil {
		x.scheme = "https"
	}
	ctx := tracing.Propagator(nil).Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	var attrs []attribute.KeyValue
	x.method, attrs = tracing.HTTPMethod(r.Method)
	name := x.method
	if x.route != "" {
		name += " " + x.route
		attrs = append(attrs, semconv.HTTPRoute(x.route))
	}
	attrs = append(attrs, semconv.URLPath(r.URL.Path), semconv.URLScheme(x.scheme), attrOperation.String(e.route.Operation))
	attrs = append(attrs, tracing.ServerAddress(r.Host, 0)...)
	if ua := r.UserAgent(); ua != "" {
		attrs = append(attrs, semconv.UserAgentOriginal(ua))
	}
	if r.ProtoMajor > 0 {
		attrs = append(attrs, semconv.NetworkProtocolVersion(strconv.Itoa(r.ProtoMajor)+"."+strconv.Itoa(r.ProtoMinor)))
	}
	ctx, x.span = e.m.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return x, x.w, r.WithContext(ctx)
}

// end records the status on the span and the request duration, and ends
// the span. A 5xx is an error of the server; a 4xx is the client's.
func (e *endpoint) end(ctx context.Context, x *exchange) {
	status := x.w.status
	if status == 0 {
		status = http.StatusOK
	}
	errType := ""
	if status >= 500 {
		errType = strconv.Itoa(status)
		x.span.SetStatus(codes.Error, http.StatusText(status))
	}
	if x.span.IsRecording() {
		x.span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if errType != "" {
			x.span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		}
	}
	x.span.End()
	attrs := []attribute.KeyValue{semconv.HTTPResponseStatusCode(status)}
	if x.route != "" {
		attrs = append(attrs, semconv.HTTPRoute(x.route))
	}
	if errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
	}
	e.m.metrics.duration.Record(ctx, time.Since(x.start).Seconds(), httpconv.RequestMethodAttr(x.method), x.scheme, attrs...)
}

// decide notes on the request's span what the middleware did, and the key.
func decide(ctx context.Context, decision string, c *Claim) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrDecision.String(decision))
	if c != nil {
		span.SetAttributes(attrKeyID.String(c.KeyID()))
	}
}

// routeOf returns the path template of an http.ServeMux pattern
// ("[METHOD ][HOST]/PATH"), or "" when there is none.
func routeOf(pattern string) string {
	if _, rest, ok := strings.Cut(pattern, " "); ok {
		pattern = strings.TrimLeft(rest, " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}

// statusWriter notes the status a handler writes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
