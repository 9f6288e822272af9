package engine

import (
	"context"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/tracing"
)

const instrumentation = "github.com/idemkit/idem/consumer"

// durationBuckets are the boundaries, in seconds, of the runtime's
// duration histograms: a handler or a commit takes from a fraction of a
// millisecond to seconds.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Telemetry holds the runtime's instruments, shared by the engine and its
// sources. Metric attributes are low-cardinality — the messaging system,
// the consumer (messaging.consumer.group.name: every process with one Name
// shares its work) and the queue or stream it reads
// (messaging.destination.subscription.name), plus an outcome, decision or
// reason — and message ids, exchanges and routing keys go on spans only.
type Telemetry struct {
	name, source string
	tracer       trace.Tracer
	consumed     metric.Int64Counter
	processDur   metric.Float64Histogram
	messages     metric.Int64Counter
	decisions    metric.Int64Counter
	deadLetters  metric.Int64Counter
	redelivered  metric.Int64Counter
	batchSize    metric.Int64Histogram
	commitDur    metric.Float64Histogram
	batchRetries metric.Int64Counter
	acksDropped  metric.Int64Counter
	reconnects   metric.Int64Counter
	limits       metric.Int64Counter
	abandonedN   metric.Int64Counter
	base         []attribute.KeyValue
	// Built once, used per message: an option built per call is an
	// allocation per message.
	baseRecord  []metric.RecordOption
	baseAdd     []metric.AddOption
	processOpt  []metric.RecordOption
	consumedOpt []metric.AddOption
	byOutcome   map[idem.Outcome][]metric.AddOption
	byDecision  map[inbox.Decision][]metric.AddOption
	conflictOpt []metric.AddOption
	spanStart   []trace.SpanStartOption
	lagSet      atomic.Pointer[attribute.Set] // read by the lag gauge's callback
}

// newTelemetry builds the instruments of consumer name reading source (a
// queue or a stream); nil providers mean the global ones. lag reports the
// stream lag, when there is one.
func newTelemetry(name, source string, mp metric.MeterProvider, tp trace.TracerProvider, lag func() (int64, bool)) (*Telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	t := &Telemetry{name: name, tracer: tp.Tracer(instrumentation, trace.WithSchemaURL(tracing.SchemaURL))}
	t.spanStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	t.setSource(source)
	if err := t.semconvInstruments(m); err != nil {
		return nil, err
	}
	if err := t.idemInstruments(m); err != nil {
		return nil, err
	}
	return t, t.lagGauge(m, lag)
}

// semconvInstruments builds the messaging instruments of the OpenTelemetry
// semantic conventions.
func (t *Telemetry) semconvInstruments(m metric.Meter) error {
	consumed, err := messagingconv.NewClientConsumedMessages(m)
	if err != nil {
		return err
	}
	process, err := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return err
	}
	t.consumed, t.processDur = consumed.Inst(), process.Inst()
	return nil
}

// idemInstruments builds idem's own instruments.
func (t *Telemetry) idemInstruments(m metric.Meter) error {
	var err error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithDescription(desc))
		}
	}
	counter(&t.messages, "idem.consumer.messages", "Messages by outcome: "+outcomeList()+", and conflict (a dead letter whose payload conflicted, counted there only).")
	counter(&t.decisions, "idem.consumer.inbox.decisions", "Inbox claims by decision: new, duplicate, conflict.")
	counter(&t.deadLetters, "idem.consumer.dead_letters", "Messages dead-lettered, by reason.")
	counter(&t.redelivered, "idem.consumer.redeliveries", "Deliveries the broker made before (redelivered, x-delivery-count), run alone.")
	counter(&t.batchRetries, "idem.consumer.batch.retries", "Batch transactions retried after a database failure or a conflict (contention).")
	counter(&t.acksDropped, "idem.consumer.acks.dropped", "Acks not sent because their channel died (the broker redelivers).")
	counter(&t.reconnects, "idem.consumer.reconnects", "Broker reconnects (queues) and stream reader restarts.")
	counter(&t.limits, "idem.consumer.limits", "Messages dead-lettered by a limit: message_bytes, headers, id_bytes.")
	counter(&t.abandonedN, "idem.consumer.handlers.abandoned", "Handlers that ignored their context past HandlerTimeout and were abandoned.")
	if err != nil {
		return err
	}
	if t.batchSize, err = m.Int64Histogram("idem.consumer.batch.size", metric.WithUnit("{message}"),
		metric.WithDescription("Messages per batch transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)); err != nil {
		return err
	}
	t.commitDur, err = m.Float64Histogram("idem.consumer.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent committing a batch transaction."), metric.WithExplicitBucketBoundaries(durationBuckets...))
	return err
}

// setSource builds the attribute sets of the metrics for source: built
// once, used per message (an option built per call is an allocation per
// message). Call it before the engine runs batches.
func (t *Telemetry) setSource(source string) {
	t.source = source
	t.base = []attribute.KeyValue{semconv.MessagingSystemRabbitMQ, semconv.MessagingConsumerGroupName(t.name),
		semconv.MessagingDestinationSubscriptionName(source)}
	set := attribute.NewSet(t.base...)
	t.lagSet.Store(&set)
	t.baseRecord = []metric.RecordOption{metric.WithAttributeSet(set)}
	t.baseAdd = []metric.AddOption{metric.WithAttributeSet(set)}
	t.processOpt = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(t.base, semconv.MessagingOperationName("process"))...))}
	t.consumedOpt = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(t.base, semconv.MessagingOperationName("receive"))...))}
	t.byOutcome = map[idem.Outcome][]metric.AddOption{}
	for _, o := range idem.Outcomes() {
		t.byOutcome[o] = []metric.AddOption{t.with(attribute.String("outcome", o.String()))}
	}
	t.conflictOpt = []metric.AddOption{t.with(attribute.String("outcome", "conflict"))}
	t.byDecision = map[inbox.Decision][]metric.AddOption{}
	for _, d := range []inbox.Decision{inbox.NewMessage, inbox.Duplicate, inbox.Conflict} {
		t.byDecision[d] = []metric.AddOption{t.with(attribute.String("decision", d.String()))}
	}
}

func (t *Telemetry) lagGauge(m metric.Meter, lag func() (int64, bool)) error {
	_, err := m.Int64ObservableGauge("idem.consumer.stream.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Stream tail offset minus the committed checkpoint (sampled every 10s)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if n, ok := lag(); ok {
				o.Observe(n, metric.WithAttributeSet(*t.lagSet.Load()))
			}
			return nil
		}))
	return err
}

func (t *Telemetry) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(kv, t.base...)...)
}

// Redelivered counts a delivery the broker made before.
func (t *Telemetry) Redelivered(ctx context.Context) { t.redelivered.Add(ctx, 1, t.baseAdd...) }

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
func (t *Telemetry) Reconnect(ctx context.Context) { t.reconnects.Add(ctx, 1, t.baseAdd...) }

func (t *Telemetry) abandoned(ctx context.Context) { t.abandonedN.Add(ctx, 1, t.baseAdd...) }

// reasonAttr is a dead letter's reason as a metric attribute.
func reasonAttr(reason string) attribute.KeyValue { return attribute.String("reason", reason) }

// outcomeList names the outcomes, for the messages counter's description.
func outcomeList() string {
	names := make([]string, 0, idem.MaxOutcome)
	for _, o := range idem.Outcomes() {
		names = append(names, o.String())
	}
	return strings.Join(names, ", ")
}
