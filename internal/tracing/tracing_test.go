package tracing_test

import (
	"context"
	"net/http"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// remote is a sampled span context as a publisher would send it.
func remote(t *testing.T) trace.SpanContext {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	ts, err := trace.ParseTraceState("vendor=value")
	require.NoError(t, err)
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
}

func TestPropagatorPropagatesW3CWithoutAnyGlobalSet(t *testing.T) {
	// Sequential, and first: the next test sets the global propagator.
	p := tracing.Propagator(nil)
	require.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, p.Fields())

	h := amqp.Table{}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote(t))
	p.Inject(ctx, tracing.AMQPCarrier(h))
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", h["traceparent"])

	got := trace.SpanContextFromContext(p.Extract(context.Background(), tracing.AMQPCarrier(h)))
	require.Equal(t, remote(t).TraceID(), got.TraceID())
	require.Equal(t, remote(t).SpanID(), got.SpanID())
}

// TestPropagatorUsesTheGlobalOnceTheApplicationSetsOne sets the global
// propagator for good (it cannot be unset): it runs after the test above and
// before the parallel tests, which work with either propagator.
func TestPropagatorUsesTheGlobalOnceTheApplicationSetsOne(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	require.ElementsMatch(t, []string{"traceparent", "tracestate"}, tracing.Propagator(nil).Fields(), "no baggage: the application's choice")
}

func TestPropagatorPrefersTheComponentsOwn(t *testing.T) {
	t.Parallel()
	own := propagation.TraceContext{}
	require.Equal(t, propagation.TextMapPropagator(own), tracing.Propagator(own))
}

func TestAMQPCarrierReadsByteArrayHeaders(t *testing.T) {
	t.Parallel()
	h := amqp.Table{"traceparent": []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "n": int32(3)}
	c := tracing.AMQPCarrier(h)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", c.Get("traceparent"))
	require.Empty(t, c.Get("n"))
	require.ElementsMatch(t, []string{"traceparent", "n"}, c.Keys())
	sc := trace.SpanContextFromContext(tracing.Propagator(nil).Extract(context.Background(), c))
	require.Equal(t, remote(t).TraceID(), sc.TraceID())
}

func TestSaveAndRestoreKeepTheSpanContextButNotBaggage(t *testing.T) {
	t.Parallel()
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote(t))
	m, err := baggage.NewMember("user", "alice")
	require.NoError(t, err)
	b, err := baggage.New(m)
	require.NoError(t, err)
	ctx = baggage.ContextWithBaggage(ctx, b)

	saved := tracing.Save(ctx)
	require.Equal(t, map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "vendor=value",
	}, saved)

	got := trace.SpanContextFromContext(tracing.Restore(context.Background(), saved))
	require.True(t, got.IsRemote())
	require.Equal(t, remote(t).TraceID(), got.TraceID())
	require.Equal(t, remote(t).SpanID(), got.SpanID())
	require.Equal(t, "vendor=value", got.TraceState().String())
}

func TestSaveWithoutASpanIsNil(t *testing.T) {
	t.Parallel()
	require.Nil(t, tracing.Save(context.Background()))
	ctx := tracing.Restore(context.Background(), nil)
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
	ctx = tracing.Restore(context.Background(), map[string]string{"traceparent": "garbage"})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
}

func TestHTTPMethodKeepsUnknownMethodsOutOfTheAttribute(t *testing.T) {
	t.Parallel()
	name, kv := tracing.HTTPMethod(http.MethodPost)
	require.Equal(t, "POST", name)
	require.Equal(t, []attribute.KeyValue{semconv.HTTPRequestMethodPost}, kv)

	name, kv = tracing.HTTPMethod("BREW")
	require.Equal(t, "_OTHER", name)
	require.Equal(t, []attribute.KeyValue{semconv.HTTPRequestMethodOther, semconv.HTTPRequestMethodOriginal("BREW")}, kv)
}

func TestServerAddressSplitsHostAndPort(t *testing.T) {
	t.Parallel()
	require.Equal(t, []attribute.KeyValue{semconv.ServerAddress("gw.example"), semconv.ServerPort(8443)},
		tracing.ServerAddress("gw.example:8443", 443))
	require.Equal(t, []attribute.KeyValue{semconv.ServerAddress("gw.example"), semconv.ServerPort(443)},
		tracing.ServerAddress("gw.example", 443))
	require.Equal(t, []attribute.KeyValue{semconv.ServerAddress("::1"), semconv.ServerPort(80)},
		tracing.ServerAddress("[::1]:80", 0))
	require.Nil(t, tracing.ServerAddress("", 80))
}
