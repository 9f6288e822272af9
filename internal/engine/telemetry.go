package engine

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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
	processDur   metric.Float64Histogram
	redelivered  metric.Int64Counter
	batchSize    metric.Int64Histogram
	commitDur    metric.Float64Histogram
	batchRetries metric.Int64Counter
	acksDropped  metric.Int64Counter
	reconnects   metric.Int64Counter
	limits       metric.Int64Counter
	abandonedN   metric.Int64Counter
	orderGaps    metric.Int64Counter
	base         []attribute.KeyValue
	// Built once, used per message: an option built per call is an
	// allocation per message.
	baseRecord []metric.RecordOption
	baseAdd    []metric.AddOption
	processOpt []metric.RecordOption
	spanStart  []trace.SpanStartOption
	// sets are the attribute sets of the observed instruments, read by
	// their callback (see observe).
	sets atomic.Pointer[attributeSets]
}

// attributeSets are the attribute sets of the observed instruments for one
// source.
type attributeSets struct {
	base, consumed, conflict attribute.Set
	byOutcome                map[idem.Outcome]attribute.Set
	byDecision               map[inbox.Decision]attribute.Set
}

// newTelemetry builds the instruments of consumer name reading source (a
// queue or a stream); nil providers mean the global ones. lag reports the
// stream lag, when there is one; the counters of messages received, by
// outcome, by decision and by dead-letter reason are observed in counts.
func newTelemetry(name, source string, mp metric.MeterProvider, tp trace.TracerProvider, lag func() (int64, bool), counts *Counters) (*Telemetry, error) {
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
	if err := t.observedInstruments(m, counts); err != nil {
		return nil, err
	}
	return t, t.lagGauge(m, lag)
}

// semconvInstruments builds the messaging instruments of the OpenTelemetry
// semantic conventions.
func (t *Telemetry) semconvInstruments(m metric.Meter) error {
	process, err := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return err
	}
	t.processDur = process.Inst()
	return nil
}

// observedInstruments builds the counters whose values are the engine's
// Counters (Count and PrepareAll count): messages received (the semantic
// conventions' consumed messages), by outcome, by inbox decision and by
// dead-letter reason. Only the counts above zero are reported, as a
// counter reports only what was added to it.
func (t *Telemetry) observedInstruments(m metric.Meter, counts *Counters) error {
	conv := messagingconv.ClientConsumedMessages{}
	consumed, err := m.Int64ObservableCounter(conv.Name(), metric.WithUnit(conv.Unit()), metric.WithDescription(conv.Description()))
	if err != nil {
		return err
	}
	var messages, decisions, deadLetters metric.Int64ObservableCounter
	counter := func(dst *metric.Int64ObservableCounter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64ObservableCounter(name, metric.WithDescription(desc))
		}
	}
	counter(&messages, "idem.consumer.messages", "Messages by outcome: "+outcomeList()+", and conflict (a dead letter whose payload conflicted, counted there only).")
	counter(&decisions, "idem.consumer.inbox.decisions", "Inbox claims by decision: new, duplicate, conflict.")
	counter(&deadLetters, "idem.consumer.dead_letters", "Messages dead-lettered, by reason.")
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c, sets := counts.counted(), t.sets.Load()
		observe := func(inst metric.Int64Observable, n int64, set attribute.Set) {
			if n > 0 {
				o.ObserveInt64(inst, n, metric.WithAttributeSet(set))
			}
		}
		observe(consumed, c.consumed, sets.consumed)
		for out, set := range sets.byOutcome {
			observe(messages, c.outcomes[out], set)
		}
		observe(messages, c.conflicts, sets.conflict)
		for d, set := range sets.byDecision {
			observe(decisions, c.decisions[d], set)
		}
		for reason, n := range c.reasons {
			observe(deadLetters, n, attribute.NewSet(append([]attribute.KeyValue{reasonAttr(reason)}, sets.base.ToSlice()...)...))
		}
		return nil
	}, consumed, messages, decisions, deadLetters)
	return err
}

// idemInstruments builds idem's own instruments.
func (t *Telemetry) idemInstruments(m metric.Meter) error {
	var err error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithDescription(desc))
		}
	}
	counter(&t.redelivered, "idem.consumer.redeliveries", "Deliveries the broker made before (redelivered, x-delivery-count), run alone.")
	counter(&t.batchRetries, "idem.consumer.batch.retries", "Batch transactions retried after a database failure or a conflict (contention).")
	counter(&t.acksDropped, "idem.consumer.acks.dropped", "Acks not sent because their channel died (the broker redelivers).")
	counter(&t.reconnects, "idem.consumer.reconnects", "Broker reconnects (queues) and stream reader restarts.")
	counter(&t.limits, "idem.consumer.limits", "Messages dead-lettered by a limit: message_bytes, headers, id_bytes.")
	counter(&t.abandonedN, "idem.consumer.handlers.abandoned", "Handlers that ignored their context past HandlerTimeout and were abandoned.")
	counter(&t.orderGaps, "idem.consumer.order.gaps", "Messages dead-lettered by a queue consumer with an ordering key: their key moved on without them.")
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
	with := func(kv ...attribute.KeyValue) attribute.Set { return attribute.NewSet(append(kv, t.base...)...) }
	sets := &attributeSets{base: attribute.NewSet(t.base...), consumed: with(semconv.MessagingOperationName("receive")),
		conflict: with(attribute.String("outcome", "conflict")), byOutcome: map[idem.Outcome]attribute.Set{},
		byDecision: map[inbox.Decision]attribute.Set{}}
	for _, o := range idem.Outcomes() {
		sets.byOutcome[o] = with(attribute.String("outcome", o.String()))
	}
	for _, d := range []inbox.Decision{inbox.NewMessage, inbox.Duplicate, inbox.Conflict} {
		sets.byDecision[d] = with(attribute.String("decision", d.String()))
	}
	t.sets.Store(sets)
	t.baseRecord = []metric.RecordOption{metric.WithAttributeSet(sets.base)}
	t.baseAdd = []metric.AddOption{metric.WithAttributeSet(sets.base)}
	t.processOpt = []metric.RecordOption{metric.WithAttributeSet(with(semconv.MessagingOperationName("process")))}
}

func (t *Telemetry) lagGauge(m metric.Meter, lag func() (int64, bool)) error {
	_, err := m.Int64ObservableGauge("idem.consumer.stream.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Stream tail offset minus the committed checkpoint (sampled every 10s)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if n, ok := lag(); ok {
				o.Observe(n, metric.WithAttributeSet(t.sets.Load().base))
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

// OrderGaps counts n messages a queue with an ordering key dead-lettered.
func (t *Telemetry) OrderGaps(ctx context.Context, n int) {
	t.orderGaps.Add(ctx, int64(n), t.baseAdd...)
}

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

// startBatch starts the process span of each of an attempt's items, into
// ctxs and spans (see startSpan), and records the batch's size.
func (t *Telemetry) startBatch(ctx context.Context, items []*Item, ctxs []context.Context, spans []trace.Span) {
	for i, it := range items {
		ctxs[i], spans[i] = t.startSpan(ctx, it, len(items))
	}
	t.batchSize.Record(ctx, int64(len(items)), t.baseRecord...)
}

// endBatch records how an attempt went: each message's result on its span,
// how long each handler that returned ran (took), and how long its commit
// took (commit; 0 when it did not commit).
func (t *Telemetry) endBatch(ctx context.Context, spans []trace.Span, results []Result, took []time.Duration, commit time.Duration) {
	for i, span := range spans {
		endSpan(span, results[i])
	}
	for _, d := range took {
		t.processDur.Record(ctx, d.Seconds(), t.processOpt...)
	}
	if commit > 0 {
		t.commitDur.Record(ctx, commit.Seconds(), t.baseRecord...)
	}
}

// startSpan starts the process span of one message, a child of the trace
// context found in its headers (W3C trace context by default), named and
// attributed after the messaging semantic conventions: for a queue the
// destination is the exchange the message was published to (with its
// routing key and the delivery tag), for a stream the stream.
func (t *Telemetry) startSpan(ctx context.Context, it *Item, batchSize int) (context.Context, trace.Span) {
	if len(it.Headers) > 0 {
		ctx = tracing.Propagator(nil).Extract(ctx, tracing.AMQPCarrier(it.Headers))
	}
	ctx, span := t.tracer.Start(ctx, "process "+it.Source, t.spanStart...)
	if !span.IsRecording() {
		return ctx, span // tracing is off: build no attributes
	}
	destination := it.Exchange
	if it.HasOffset {
		destination = it.Source
	}
	span.SetAttributes(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(destination),
		semconv.MessagingDestinationSubscriptionName(it.Source),
		semconv.MessagingConsumerGroupName(t.name),
		semconv.MessagingMessageID(it.ID),
		semconv.MessagingMessageBodySize(len(it.Body)),
		semconv.MessagingBatchMessageCount(batchSize),
	)
	if it.CorrelationID != "" {
		span.SetAttributes(semconv.MessagingMessageConversationID(it.CorrelationID))
	}
	if it.RoutingKey != "" {
		span.SetAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(it.RoutingKey))
	}
	if it.DeliveryTag != 0 {
		span.SetAttributes(semconv.MessagingRabbitMQMessageDeliveryTag(int(it.DeliveryTag)))
	}
	if it.HasOffset {
		span.SetAttributes(attribute.String("messaging.rabbitmq.stream.offset", strconv.FormatInt(it.Offset, 10)))
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
	if r.Err != nil && r.Outcome != idem.Processed {
		span.SetStatus(codes.Error, r.Err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(r.Outcome.String()))
	}
	span.End()
}
