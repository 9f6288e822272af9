package ledger_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ledger"
)

// tracer is an SDK tracer provider whose spans end in an in-memory
// recorder.
func tracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// recordUnder records e in a transaction whose context carries span ctx,
// at once or, with deferred, the way the consumer's batches do (one
// statement before the commit).
func (f *fixture) recordUnder(t *testing.T, ctx context.Context, deferred bool, e ledger.Effect) ledger.Entry {
	t.Helper()
	var got ledger.Entry
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var d *idem.Deferred
		rctx := ctx
		if deferred {
			d = &idem.Deferred{}
			rctx = idem.WithDeferred(ctx, d)
		}
		var err error
		if got, err = f.ledger.Record(rctx, tx, e); err != nil {
			return err
		}
		if d != nil {
			return d.Flush(ctx, tx)
		}
		return nil
	}))
	return got
}

// tracedTarget is an HTTP target that keeps the traceparent of every
// request.
type tracedTarget struct {
	*target
	mu      sync.Mutex
	parents []string
}

func newTracedTarget(t *testing.T) *tracedTarget {
	tt := &tracedTarget{}
	tt.target = newTarget(t, func(w http.ResponseWriter, r *http.Request, n int) {
		tt.mu.Lock()
		tt.parents = append(tt.parents, r.Header.Get("traceparent"))
		tt.mu.Unlock()
		ok(w, r, n)
	})
	return tt
}

func (tt *tracedTarget) traceparents() []string {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return append([]string(nil), tt.parents...)
}

// traceparentIDs splits a W3C traceparent into its trace and span ids.
func traceparentIDs(t *testing.T, tp string) (trace.TraceID, trace.SpanID) {
	t.Helper()
	parts := strings.Split(tp, "-")
	require.Len(t, parts, 4, "traceparent %q", tp)
	tid, err := trace.TraceIDFromHex(parts[1])
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(parts[2])
	require.NoError(t, err)
	return tid, sid
}

// spanNamed returns the only ended span called name.
func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestHTTPCallCarriesTheTraceOfTheSpanThatRecordedTheEffect(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		name := map[bool]string{false: "Immediate", true: "Deferred"}[deferred]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			tp, rec := tracer(t)
			tg := newTracedTarget(t)
			ctx, handler := tp.Tracer("test").Start(context.Background(), "process payments")
			e := f.recordUnder(t, ctx, deferred, ledger.Effect{Type: "capture", BusinessKey: "o-1", Target: tg.URL + "/captures?token=s3cret", Request: []byte(`{}`)})
			handler.End()
			require.Equal(t, handler.SpanContext().TraceID().String(), e.TraceContext["traceparent"][3:35])

			f.dispatch(t, ledger.DispatcherConfig{TracerProvider: tp,
				Executors: map[string]ledger.Executor{"capture": &ledger.HTTPExecutor{}}})
			f.waitFor(t, e.ID, status(ledger.StatusSucceeded))

			got := tg.traceparents()
			require.Len(t, got, 1)
			tid, sid := traceparentIDs(t, got[0])
			require.Equal(t, handler.SpanContext().TraceID(), tid, "the target continues the handler's trace")

			dispatch := spanNamed(t, rec, "dispatch capture")
			require.Equal(t, handler.SpanContext().SpanID(), dispatch.Parent().SpanID(), "the attempt is a child of the span that recorded it")
			require.Equal(t, trace.SpanKindInternal, dispatch.SpanKind())
			da := attrs(dispatch)
			require.Equal(t, e.ID, da["idem.effect.id"].AsString())
			require.Equal(t, "capture", da["idem.effect.type"].AsString())
			require.EqualValues(t, 1, da["idem.effect.attempt"].AsInt64())
			require.Equal(t, "succeeded", da["idem.effect.status"].AsString())

			client := spanNamed(t, rec, "POST")
			require.Equal(t, dispatch.SpanContext().SpanID(), client.Parent().SpanID())
			require.Equal(t, client.SpanContext().SpanID(), sid, "the traceparent sent is the client span's")
			require.Equal(t, trace.SpanKindClient, client.SpanKind())
			ca := attrs(client)
			require.Equal(t, "POST", ca[semconv.HTTPRequestMethodKey].AsString())
			require.EqualValues(t, http.StatusOK, ca[semconv.HTTPResponseStatusCodeKey].AsInt64())
			require.Equal(t, "127.0.0.1", ca[semconv.ServerAddressKey].AsString())
			require.NotZero(t, ca[semconv.ServerPortKey].AsInt64())
			require.Equal(t, tg.URL+"/captures?token=REDACTED", ca[semconv.URLFullKey].AsString(), "query values may be secrets")
		})
	}
}

func TestHTTPCallCarriesTheTraceWithoutAnySDKConfigured(t *testing.T) {
	t.Parallel()
	// No TracerProvider and no propagator set anywhere, as in a worker that
	// configures nothing: the remote parent a consumer extracted from a
	// message still reaches the target.
	f := newFixture(t)
	tg := newTracedTarget(t)
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	e := f.recordUnder(t, ctx, false, ledger.Effect{Type: "capture", BusinessKey: "o-1", Target: tg.URL, Request: []byte(`{}`)})
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"capture": &ledger.HTTPExecutor{}}})
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	got := tg.traceparents()
	require.Len(t, got, 1)
	tid, _ := traceparentIDs(t, got[0])
	require.Equal(t, parent.TraceID(), tid)
}

func TestEffectRecordedOutsideATraceStartsANewOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tp, rec := tracer(t)
	tg := newTracedTarget(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "capture", BusinessKey: "o-1", Target: tg.URL, Request: []byte(`{}`)})[0]
	require.Nil(t, e.TraceContext)
	// Run's own context carries a span: it must not become every effect's
	// parent.
	ctx, run := tp.Tracer("test").Start(context.Background(), "run")
	ctx, cancel := context.WithCancel(ctx)
	stopped := f.start(t, ctx, ledger.DispatcherConfig{TracerProvider: tp,
		Executors: map[string]ledger.Executor{"capture": &ledger.HTTPExecutor{}}})
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	cancel()
	require.NoError(t, <-stopped)
	run.End()
	dispatch := spanNamed(t, rec, "dispatch capture")
	require.False(t, dispatch.Parent().IsValid(), "a root span")
	require.NotEqual(t, run.SpanContext().TraceID(), dispatch.SpanContext().TraceID())
}

func TestOutboxMessageCarriesTheTraceOfTheSpanThatRecordedTheEffect(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		name := map[bool]string{false: "Immediate", true: "Deferred"}[deferred]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			q, ch := outboxQueue(t)
			ex := newOutbox(t)
			tp, rec := tracer(t)
			ctx, handler := tp.Tracer("test").Start(context.Background(), "POST /orders")
			e := f.recordUnder(t, ctx, deferred, ledger.Effect{Type: "order.confirmed", BusinessKey: "order-9",
				Request: ledger.Publishing{RoutingKey: q, Body: []byte(`{"order":9}`), CorrelationID: "corr-9",
					Headers: map[string]string{"traceparent": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01"}}})
			handler.End()
			f.dispatch(t, ledger.DispatcherConfig{TracerProvider: tp, Executors: map[string]ledger.Executor{"order.confirmed": ex}})
			f.waitFor(t, e.ID, status(ledger.StatusSucceeded))

			d := getMessage(t, ch, q)
			tp2, _ := d.Headers["traceparent"].(string)
			tid, sid := traceparentIDs(t, tp2)
			require.Equal(t, handler.SpanContext().TraceID(), tid, "the message continues the handler's trace, whatever its recorded headers said")

			producer := spanNamed(t, rec, "publish "+q)
			require.Equal(t, producer.SpanContext().SpanID(), sid)
			require.Equal(t, trace.SpanKindProducer, producer.SpanKind())
			require.Equal(t, spanNamed(t, rec, "dispatch order.confirmed").SpanContext().SpanID(), producer.Parent().SpanID())
			pa := attrs(producer)
			require.Equal(t, semconv.MessagingSystemRabbitMQ.Value, pa[semconv.MessagingSystemKey])
			require.Equal(t, semconv.MessagingOperationTypeSend.Value, pa[semconv.MessagingOperationTypeKey])
			require.Equal(t, "publish", pa[semconv.MessagingOperationNameKey].AsString())
			require.Equal(t, q, pa[semconv.MessagingDestinationNameKey].AsString())
			require.Equal(t, q, pa[semconv.MessagingRabbitMQDestinationRoutingKeyKey].AsString())
			require.Equal(t, e.ID, pa[semconv.MessagingMessageIDKey].AsString())
			require.Equal(t, "corr-9", pa[semconv.MessagingMessageConversationIDKey].AsString())
			require.EqualValues(t, len(`{"order":9}`), pa[semconv.MessagingMessageBodySizeKey].AsInt64())
			require.Equal(t, "127.0.0.1", pa[semconv.ServerAddressKey].AsString())
		})
	}
}

func TestFailedCallMarksItsSpansAsErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tp, rec := tracer(t)
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusUnprocessableEntity) })
	e := f.record(t, context.Background(), ledger.Effect{Type: "capture", BusinessKey: "o-1", Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{TracerProvider: tp, Executors: map[string]ledger.Executor{"capture": &ledger.HTTPExecutor{}}})
	f.waitFor(t, e.ID, status(ledger.StatusFailedTerminal))
	dispatch := spanNamed(t, rec, "dispatch capture")
	require.Equal(t, "failed_terminal", attrs(dispatch)["idem.effect.status"].AsString())
	require.Equal(t, "Error", dispatch.Status().Code.String())
	client := spanNamed(t, rec, "POST")
	require.Equal(t, "422", attrs(client)[semconv.ErrorTypeKey].AsString())
	require.Equal(t, "Error", client.Status().Code.String())
}

// getMessage reads one message from q, waiting for it.
func getMessage(t *testing.T, ch *amqp.Channel, q string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if ok {
			return d
		}
		require.True(t, time.Now().Before(deadline), "no message in %s", q)
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDispatchMetricsCountEffectsByStatusWithoutIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reader := sdkmetric.NewManualReader()
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1", Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Executors: map[string]ledger.Executor{"charge": funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
			return ledger.Result{Status: ledger.StatusSucceeded}, nil
		}}}})
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	deadline := time.Now().Add(15 * time.Second)
	for counter(t, reader, "idem.ledger.transitions") < 2 { // in_flight, succeeded
		require.True(t, time.Now().Before(deadline), "transitions not counted")
		time.Sleep(10 * time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "idem.ledger.transitions":
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					require.ElementsMatch(t, []attribute.Key{"effect_type", "status"}, keys(dp.Attributes))
				}
				seen++
			case "idem.ledger.dispatch.duration":
				h := m.Data.(metricdata.Histogram[float64])
				require.Equal(t, "s", m.Unit)
				require.Len(t, h.DataPoints, 1)
				require.Subset(t, h.DataPoints[0].Bounds, []float64{0.01, 0.1, 1}, "buckets in seconds, not the SDK's millisecond defaults")
				require.ElementsMatch(t, []attribute.Key{"effect_type", "status"}, keys(h.DataPoints[0].Attributes))
				seen++
			}
		}
	}
	require.Equal(t, 2, seen)
}

// keys returns the attribute keys of a set: ids must never be among them.
func keys(s attribute.Set) []attribute.Key {
	var out []attribute.Key
	for _, kv := range s.ToSlice() {
		out = append(out, kv.Key)
	}
	return out
}
