package engine

import (
	"context"
	"strconv"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/tracing"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/idemkit/idem/consumer"

// Telemetry holds the runtime's instruments, shared by the engine and its
// sources. Attributes are low-cardinality (consumer name, source, outcome);
// message ids go on spans only.
type Telemetry struct {
	name         string
	tracer       trace.Tracer
	messages     metric.Int64Counter
	batchSize    metric.Int64Histogram
	handlerDur   metric.Float64Histogram
	commitDur    metric.Float64Histogram
	batchRetries metric.Int64Counter
	acksDropped  metric.Int64Counter
	reconnects   metric.Int64Counter
	limits       metric.Int64Counter
	abandonedN   metric.Int64Counter
	base         attribute.Set
	baseAttrs    []attribute.KeyValue
	// Built once, used on every message: an option or a name built per
	// call is an allocation per message.
	baseRecord []metric.RecordOption // WithAttributeSet(base)
	baseAdd    []metric.AddOption    // WithAttributeSet(base)
	source     string                // the configured source
	spanName   string                // "process " + source
	spanStart  []trace.SpanStartOption
	byOutcome  map[string][]metric.AddOption // read-only after newTelemetry
}

// NewTelemetry builds the instruments of consumer name reading source; nil
// providers mean the global ones. lag reports the stream lag, when there is one.
func NewTelemetry(name, source string, mp metric.MeterProvider, tp trace.TracerProvider, lag func() (int64, bool)) (*Telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(instrumentation)
	t := &Telemetry{name: name, tracer: tp.Tracer(instrumentation)}
	t.baseAttrs = []attribute.KeyValue{attribute.String("idem.consumer", name), attribute.String("messaging.destination.name", source)}
	t.base = attribute.NewSet(t.baseAttrs...)
	t.baseRecord = []metric.RecordOption{metric.WithAttributeSet(t.base)}
	t.baseAdd = []metric.AddOption{metric.WithAttributeSet(t.base)}
	t.source, t.spanName = source, "process "+source
	t.spanStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	t.byOutcome = map[string][]metric.AddOption{}
	for _, name := range []string{"processed", "duplicate", "conflict", "dead_lettered", "retried", "skipped", "deferred", "unresolved"} {
		t.byOutcome[name] = []metric.AddOption{t.with(attribute.String("outcome", name))}
	}
	var err error
	if t.messages, err = m.Int64Counter("idem.consumer.messages",
		metric.WithDescription("Messages by outcome: processed, duplicate, conflict, retried, dead_lettered, unresolved.")); err != nil {
		return nil, err
	}
	if t.batchSize, err = m.Int64Histogram("idem.consumer.batch.size",
		metric.WithDescription("Messages per batch transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return nil, err
	}
	if t.handlerDur, err = m.Float64Histogram("idem.consumer.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent in the handler per message.")); err != nil {
		return nil, err
	}
	if t.commitDur, err = m.Float64Histogram("idem.consumer.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent committing a batch.")); err != nil {
		return nil, err
	}
	if t.batchRetries, err = m.Int64Counter("idem.consumer.batch.retries",
		metric.WithDescription("Batch transactions retried after a database failure.")); err != nil {
		return nil, err
	}
	if t.acksDropped, err = m.Int64Counter("idem.consumer.acks.dropped",
		metric.WithDescription("Acks not sent because their channel died (the broker redelivers).")); err != nil {
		return nil, err
	}
	if t.reconnects, err = m.Int64Counter("idem.consumer.reconnects",
		metric.WithDescription("Broker reconnects (queues) and stream reader restarts.")); err != nil {
		return nil, err
	}
	if t.limits, err = m.Int64Counter("idem.consumer.limits",
		metric.WithDescription("Messages dead-lettered by a limit: message_bytes, headers, id_bytes.")); err != nil {
		return nil, err
	}
	if t.abandonedN, err = m.Int64Counter("idem.consumer.handlers.abandoned",
		metric.WithDescription("Handlers that ignored their context past HandlerTimeout and were abandoned.")); err != nil {
		return nil, err
	}
	if _, err = m.Int64ObservableGauge("idem.consumer.stream.lag",
		metric.WithDescription("Stream tail offset minus the committed checkpoint (sampled every 10s)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if n, ok := lag(); ok {
				o.Observe(n, metric.WithAttributeSet(t.base))
			}
			return nil
		})); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Telemetry) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(kv, t.baseAttrs...)...)
}

// outcomes counts a batch's results by outcome.
func (t *Telemetry) outcomes(ctx context.Context, res []Result) {
	var counts [Deferred + 2]int
	conflicts := 0
	for _, r := range res {
		if r.Outcome == DeadLettered && r.Reason == deadletters.ReasonPayloadConflict {
			conflicts++
			continue
		}
		if int(r.Outcome) < len(counts) {
			counts[r.Outcome]++
		}
	}
	for o, n := range counts {
		if n > 0 && Outcome(o) != Deferred && o != 0 {
			t.outcome(ctx, Outcome(o).String(), n)
		}
	}
	t.outcome(ctx, "conflict", conflicts)
}

func (t *Telemetry) outcome(ctx context.Context, name string, n int) {
	if n <= 0 {
		return
	}
	if opts, ok := t.byOutcome[name]; ok {
		t.messages.Add(ctx, int64(n), opts...)
		return
	}
	t.messages.Add(ctx, int64(n), t.with(attribute.String("outcome", name)))
}

func (t *Telemetry) batch(ctx context.Context, n int) {
	t.batchSize.Record(ctx, int64(n), t.baseRecord...)
}

func (t *Telemetry) handlerTime(ctx context.Context, d time.Duration) {
	t.handlerDur.Record(ctx, d.Seconds(), t.baseRecord...)
}

func (t *Telemetry) commitTime(ctx context.Context, d time.Duration) {
	t.commitDur.Record(ctx, d.Seconds(), t.baseRecord...)
}

func (t *Telemetry) batchRetry(ctx context.Context, contention bool) {
	t.batchRetries.Add(ctx, 1, t.with(attribute.Bool("contention", contention)))
}

// AcksDropped counts n settlements skipped because their channel died.
func (t *Telemetry) AcksDropped(ctx context.Context, n int) {
	t.acksDropped.Add(ctx, int64(n), t.baseAdd...)
}

// Limit counts a message dead-lettered by the named limit.
func (t *Telemetry) Limit(name string) {
	t.limits.Add(context.Background(), 1, t.with(attribute.String("limit", name)))
}

// Reconnect counts a broker reconnect or a stream reader restart.
func (t *Telemetry) Reconnect(ctx context.Context) {
	t.reconnects.Add(ctx, 1, t.baseAdd...)
}

func (t *Telemetry) abandoned(ctx context.Context) {
	t.abandonedN.Add(ctx, 1, t.baseAdd...)
}

// startSpan starts the process span of one message, continuing the trace
// found in its headers (messaging semantic conventions).
func (t *Telemetry) startSpan(ctx context.Context, m *Item, batchSize int) (context.Context, trace.Span) {
	if len(m.Headers) > 0 {
		ctx = tracing.Propagator(nil).Extract(ctx, tracing.AMQPCarrier(m.Headers))
	}
	name := t.spanName
	if m.Source != t.source {
		name = "process " + m.Source
	}
	ctx, span := t.tracer.Start(ctx, name, t.spanStart...)
	if !span.IsRecording() {
		return ctx, span // tracing is off: build no attributes
	}
	span.SetAttributes(
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", m.Source),
		attribute.String("messaging.message.id", m.ID),
		attribute.Int("messaging.message.body.size", len(m.Body)),
		attribute.Int("messaging.batch.message_count", batchSize),
		attribute.String("idem.consumer", t.name),
	)
	if m.RoutingKey != "" {
		span.SetAttributes(attribute.String("messaging.rabbitmq.destination.routing_key", m.RoutingKey))
	}
	if m.HasOffset {
		span.SetAttributes(attribute.String("messaging.rabbitmq.stream.offset", strconv.FormatInt(m.Offset, 10)))
	}
	return ctx, span
}

// endSpan records the message's outcome on its span.
func endSpan(span trace.Span, r Result) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attribute.String("idem.outcome", r.Outcome.String()))
	if r.Reason != "" {
		span.SetAttributes(attribute.String("idem.dead_letter.reason", r.Reason))
	}
	if r.Err != nil && r.Outcome != Processed {
		span.SetStatus(codes.Error, r.Err.Error())
	}
	span.End()
}
