// Package tracing is the trace-context plumbing every idem package shares,
// so that one trace runs from an HTTP request or a message to the external
// call its effect makes:
//
//   - Propagator is the propagator used at every hop. W3C Trace Context and
//     Baggage are on by default, with no environment variable and no global
//     to set; a propagator the application installed with
//     otel.SetTextMapPropagator wins.
//   - AMQPCarrier reads and writes trace context in AMQP message headers.
//   - Save and Restore turn the span context of a context into a small text
//     map that is stored beside a ledger effect, and back.
//
// Spans follow the OpenTelemetry semantic conventions of package
// go.opentelemetry.io/otel/semconv/v1.43.0 (the newest in the otel module
// idem requires); idem's own attributes and metrics are named idem.*.
package tracing

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// defaultPropagator is W3C Trace Context and W3C Baggage.
var defaultPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator returns the propagator to inject and extract trace context
// with: p when it is not nil (a component's own option), else the global
// propagator when the application set one (otel.SetTextMapPropagator with a
// propagator that has fields), else W3C Trace Context + Baggage.
//
// Unlike otel.GetTextMapPropagator, whose default propagates nothing, it
// never returns a propagator that drops the trace. It reads the global on
// every call, so call it where context crosses a process boundary rather than
// once at construction.
func Propagator(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p != nil {
		return p
	}
	if g := otel.GetTextMapPropagator(); len(g.Fields()) > 0 {
		return g
	}
	return defaultPropagator
}

// AMQPCarrier adapts AMQP message headers to a propagator: extract from a
// delivery with
//
//	ctx = tracing.Propagator(nil).Extract(ctx, tracing.AMQPCarrier(d.Headers))
//
// and inject into a publishing (whose Headers must not be nil) with
//
//	tracing.Propagator(nil).Inject(ctx, tracing.AMQPCarrier(p.Headers))
//
// Get reads string and byte-array header values; Set writes strings.
type AMQPCarrier amqp.Table

var _ propagation.TextMapCarrier = AMQPCarrier(nil)

// Get returns the header key as a string, "" when it is absent or of
// another type.
func (c AMQPCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets the header key to value.
func (c AMQPCarrier) Set(key, value string) { c[key] = value }

// Keys returns the header names.
func (c AMQPCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// stored is the format of a saved span context. It is always W3C Trace
// Context, whatever the application propagates, so that what the database
// holds does not change with a process's configuration, and it leaves
// baggage out: baggage may carry what must not be stored.
var stored = propagation.TraceContext{}

// Save returns the W3C trace context of the span in ctx: "traceparent" and,
// when the span has a trace state, "tracestate". It returns nil when ctx
// carries no valid span context.
func Save(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	m := propagation.MapCarrier{}
	stored.Inject(ctx, m)
	return m
}

// Restore returns ctx with the span context saved in m (by Save) as its
// remote parent. It returns ctx unchanged when m holds no valid trace
// context.
func Restore(ctx context.Context, m map[string]string) context.Context {
	if len(m) == 0 {
		return ctx
	}
	return stored.Extract(ctx, propagation.MapCarrier(m))
}
