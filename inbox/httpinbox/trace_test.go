package httpinbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/ledger"
)

// incoming is the traceparent a client sends: trace
// 4bf92f3577b34da6a3ce929d0e0e4736, span 00f067aa0ba902b7.
const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// postTraced sends a POST with key and the incoming traceparent through a
// ServeMux, so the request carries its pattern.
func postTraced(h http.Handler, key string) *httptest.ResponseRecorder {
	mux := http.NewServeMux()
	mux.Handle("POST /payments", h)
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount": 5}`))
	req.Header.Set(httpinbox.HeaderKey, key)
	req.Header.Set("traceparent", incoming)
	req.Header.Set("User-Agent", "idem-test")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return rec
}

func attrsOf(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestServerSpanContinuesTheIncomingTraceWithSemconvNames(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	f := newFixture(t, httpinbox.Config{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	var handlerSpan trace.SpanContext
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		handlerSpan = trace.SpanContextFromContext(ctx)
		return f.pay(ctx, tx, r)
	})
	require.Equal(t, http.StatusCreated, postTraced(h, "k1").Code)
	require.Equal(t, "true", postTraced(h, "k1").Header().Get(httpinbox.HeaderReplayed))

	spans := rec.Ended()
	require.Len(t, spans, 2)
	first, replay := spans[0], spans[1]
	require.Equal(t, "POST /payments", first.Name())
	require.Equal(t, trace.SpanKindServer, first.SpanKind())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", first.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", first.Parent().SpanID().String())
	require.True(t, first.Parent().IsRemote())
	require.Equal(t, first.SpanContext(), handlerSpan, "the handler runs in the server span")

	a := attrsOf(first.Attributes())
	require.Equal(t, "POST", a[semconv.HTTPRequestMethodKey].AsString())
	require.Equal(t, "/payments", a[semconv.HTTPRouteKey].AsString())
	require.Equal(t, "/payments", a[semconv.URLPathKey].AsString())
	require.Equal(t, "http", a[semconv.URLSchemeKey].AsString())
	require.Equal(t, "example.com", a[semconv.ServerAddressKey].AsString())
	require.Equal(t, "idem-test", a[semconv.UserAgentOriginalKey].AsString())
	require.EqualValues(t, http.StatusCreated, a[semconv.HTTPResponseStatusCodeKey].AsInt64())
	require.Equal(t, "payments.create", a["idem.http.operation"].AsString())
	require.Equal(t, "run", a["idem.http.decision"].AsString())
	require.Equal(t, httpinbox.KeyID("", "test-client", "payments.create", "k1"), a["idem.http.key_id"].AsString())
	require.Equal(t, "replayed", attrsOf(replay.Attributes())["idem.http.decision"].AsString())

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var points []metricdata.HistogramDataPoint[float64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "http.server.request.duration" {
				require.Equal(t, "s", m.Unit)
				points = append(points, m.Data.(metricdata.Histogram[float64]).DataPoints...)
			}
		}
	}
	require.Len(t, points, 1, "both requests share one series: no key or id in the attributes")
	require.EqualValues(t, 2, points[0].Count)
	got := map[attribute.Key]string{}
	for _, kv := range points[0].Attributes.ToSlice() {
		got[kv.Key] = kv.Value.Emit()
	}
	require.Equal(t, map[attribute.Key]string{
		semconv.HTTPRequestMethodKey: "POST", semconv.URLSchemeKey: "http", semconv.HTTPRouteKey: "/payments",
		semconv.HTTPResponseStatusCodeKey: "201",
	}, got)
}

func TestServerErrorMarksTheSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	f := newFixture(t, httpinbox.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(context.Context, pgx.Tx, *http.Request) (httpinbox.Response, error) {
		return httpinbox.Response{Status: http.StatusServiceUnavailable}, nil
	})
	require.Equal(t, http.StatusServiceUnavailable, postTraced(h, "k1").Code)
	span := rec.Ended()[0]
	require.Equal(t, "Error", span.Status().Code.String())
	require.Equal(t, "503", attrsOf(span.Attributes())[semconv.ErrorTypeKey].AsString())
}

func TestOutboxMessageOfAHandlerContinuesTheRequestsTrace(t *testing.T) {
	t.Parallel()
	// Nothing configured: no TracerProvider, no propagator. An incoming
	// traceparent still reaches the message the handler's outbox publishes.
	f := newFixture(t, httpinbox.Config{})
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	l, err := ledger.New(ledger.Config{Tables: f.tables})
	require.NoError(t, err)
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		_, err := l.Record(ctx, tx, ledger.Effect{Type: "publish.payment", BusinessKey: httpinbox.FromContext(ctx).KeyID(),
			Request: ledger.Publishing{RoutingKey: q, Body: []byte(`{}`)}})
		if err != nil {
			return httpinbox.Response{}, err
		}
		return httpinbox.Response{Status: http.StatusAccepted}, nil
	})
	require.Equal(t, http.StatusAccepted, postTraced(h, "k1").Code)

	ex, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: testbroker.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ex.Close() })
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: f.pool, Tables: f.tables, PollInterval: 50 * time.Millisecond,
		Executors: map[string]ledger.Executor{"publish.payment": ex}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-stopped) })

	deadline := time.Now().Add(15 * time.Second)
	for {
		m, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if ok {
			tp, _ := m.Headers["traceparent"].(string)
			require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", strings.Split(tp+"---", "-")[1], "traceparent %q", tp)
			return
		}
		require.True(t, time.Now().Before(deadline), "no outbox message in %s", q)
		time.Sleep(10 * time.Millisecond)
	}
}
