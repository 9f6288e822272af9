package ledger

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// instrumentation is the instrumentation scope of the ledger's spans and
// metrics.
const instrumentation = "github.com/idemkit/idem/ledger"

// idem's attributes on the dispatch spans. Effect ids are high-cardinality:
// they go on spans, never on metrics.
const (
	attrEffectID      = attribute.Key("idem.effect.id")
	attrEffectType    = attribute.Key("idem.effect.type")
	attrEffectAttempt = attribute.Key("idem.effect.attempt")
	attrEffectStatus  = attribute.Key("idem.effect.status")
	attrEffectLookup  = attribute.Key("idem.effect.lookup")
)

// startSpan starts the span of one executor call (or reconciler lookup) for
// e. Its parent is the span that recorded e, restored from the trace context
// stored with it, so an attempt made hours later, by another process, still
// belongs to the trace of the request or message that caused it; an effect
// recorded outside any trace gets a new root. The executor's own client or
// producer span is a child of this one.
func (d *Dispatcher) startSpan(ctx context.Context, e Entry, lookup bool) (context.Context, trace.Span) {
	// Whatever span Run's context carries is not this effect's parent.
	ctx = tracing.Restore(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), e.TraceContext)
	name := "dispatch " + e.Type
	if lookup {
		name = "lookup " + e.Type
	}
	ctx, span := d.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	if span.IsRecording() {
		span.SetAttributes(attrEffectID.String(e.ID), attrEffectType.String(e.Type), attrEffectAttempt.Int(e.AttemptCount))
		if lookup {
			span.SetAttributes(attrEffectLookup.Bool(true))
		}
	}
	return ctx, span
}

// endSpan records the status the call leaves its effect in and ends span.
func endSpan(span trace.Span, o outcome) {
	if span.IsRecording() {
		span.SetAttributes(attrEffectStatus.String(string(o.status)))
		if o.status != StatusSucceeded {
			span.SetStatus(codes.Error, o.lastError)
		}
	}
	span.End()
}

// startCallSpan starts an executor's client or producer span as a child of
// the dispatch span in ctx, with the dispatcher's TracerProvider (the one
// the dispatch span came from).
func startCallSpan(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tracer := trace.SpanFromContext(ctx).TracerProvider().Tracer(instrumentation, trace.WithSchemaURL(tracing.SchemaURL))
	return tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// endCallSpan ends an executor's span; errorType is set when the call did
// not succeed.
func endCallSpan(span trace.Span, res Result, errorType string, err error) {
	if span.IsRecording() && res.Status != StatusSucceeded {
		if errorType == "" {
			errorType = "_OTHER"
		}
		span.SetAttributes(attribute.String("error.type", errorType))
		desc := string(res.Status)
		if err != nil {
			desc = err.Error()
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}
