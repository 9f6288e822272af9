package consumer

import (
	"context"
	"errors"
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

	"github.com/idemkit/idem"
)

// A processed, a duplicate and a dead-lettered delivery: the outcome
// counter counts each under its outcome and the consumer's attributes, the
// histograms see the batches and the handler runs, and
// every delivery gets a consumer span named after its queue, carrying its id
// and outcome.
func TestTelemetryCountsOutcomesAndSpansEachMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	e.publish("ok", `{}`, nil)
	e.publish("ok", `{}`, nil)
	e.publish("bad", `{}`, nil)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "bad" {
			return Permanent(errors.New("refused"))
		}
		return nil
	}, func(cfg *Config) {
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	})
	stop := start(t, c)
	waitFor(t, 20*time.Second, "3 deliveries settled", func() bool { return settled(c) == 3 })
	stop()

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	byName := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			byName[m.Name] = m.Data
		}
	}
	base := []attribute.KeyValue{semconv.MessagingSystemRabbitMQ, semconv.MessagingConsumerGroupName("test"),
		semconv.MessagingDestinationSubscriptionName(e.queue)}
	with := func(kv ...attribute.KeyValue) attribute.Set { return attribute.NewSet(append(kv, base...)...) }
	sums := func(name, key string) map[string]int64 {
		out := map[string]int64{}
		for _, dp := range byName[name].(metricdata.Sum[int64]).DataPoints {
			v, _ := dp.Attributes.Value(attribute.Key(key))
			require.Equal(t, with(attribute.KeyValue{Key: attribute.Key(key), Value: v}), dp.Attributes, name)
			out[v.Emit()] += dp.Value
		}
		return out
	}
	require.Equal(t, map[string]int64{"processed": 1, "duplicate": 1, "dead_lettered": 1}, sums("idem.consumer.messages", "outcome"))
	byOutcome := map[string]int64{}
	for o, n := range c.Stats().ByOutcome {
		if n > 0 {
			byOutcome[idem.Outcome(o).String()] = n
		}
	}
	require.Equal(t, sums("idem.consumer.messages", "outcome"), byOutcome, "Stats.ByOutcome counts what the metric counts")
	require.Equal(t, map[string]int64{"new": 2, "duplicate": 1}, sums("idem.consumer.inbox.decisions", "decision"))
	require.Equal(t, map[string]int64{"permanent": 1}, sums("idem.consumer.dead_letters", "reason"))
	require.Equal(t, map[string]int64{"receive": 3}, sums("messaging.client.consumed.messages", string(semconv.MessagingOperationNameKey)))
	size := byName["idem.consumer.batch.size"].(metricdata.Histogram[int64]).DataPoints
	require.Len(t, size, 1)
	require.Equal(t, attribute.NewSet(base...), size[0].Attributes)
	require.GreaterOrEqual(t, size[0].Sum, int64(3), "every message was in a batch transaction (a rerun counts again)")
	process := byName["messaging.process.duration"].(metricdata.Histogram[float64]).DataPoints
	require.Len(t, process, 1)
	require.Equal(t, with(semconv.MessagingOperationName("process")), process[0].Attributes)
	require.GreaterOrEqual(t, process[0].Count, uint64(2), "each new message ran its handler")
	require.Contains(t, byName, "idem.consumer.commit.duration")

	// A span per processing attempt: attempts abandoned for a rerun of the
	// batch (here: with savepoints, after the handler error) end
	// "unresolved"; each delivery's final attempt carries its outcome.
	ended := spans.Ended()
	require.GreaterOrEqual(t, len(ended), 3)
	outcomes := map[string][]string{}
	for _, s := range ended {
		require.Equal(t, "process "+e.queue, s.Name())
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
		attrs := attribute.NewSet(s.Attributes()...)
		for _, want := range []attribute.KeyValue{semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(""), semconv.MessagingRabbitMQDestinationRoutingKey(e.queue),
			semconv.MessagingDestinationSubscriptionName(e.queue), semconv.MessagingConsumerGroupName("test")} {
			got, _ := attrs.Value(want.Key)
			require.Equal(t, want.Value, got, "span attribute %s", want.Key)
		}
		tag, _ := attrs.Value(semconv.MessagingRabbitMQMessageDeliveryTagKey)
		require.Positive(t, tag.AsInt64(), "delivery tag")
		id, _ := attrs.Value(semconv.MessagingMessageIDKey)
		outcome, _ := attrs.Value("idem.outcome")
		if outcome.AsString() != "unresolved" {
			outcomes[id.AsString()] = append(outcomes[id.AsString()], outcome.AsString())
		}
	}
	require.ElementsMatch(t, []string{"processed", "duplicate"}, outcomes["ok"])
	require.Equal(t, []string{"dead_lettered"}, outcomes["bad"])
	require.Len(t, outcomes, 2)
}

// Process (tests, custom sources) reports the same instruments as Run.
func TestProcessReportsTheSameMetricsAsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reader := sdkmetric.NewManualReader()
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) {
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	_, err := c.Process(context.Background(), []Message{{MessageID: "a", Body: []byte(`1`)}, {MessageID: "a", Body: []byte(`1`)},
		{Body: []byte(`no id`)}})
	require.NoError(t, err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	seen := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					seen[m.Name] += dp.Value
				}
			}
		}
	}
	require.EqualValues(t, 3, seen["messaging.client.consumed.messages"])
	require.EqualValues(t, 3, seen["idem.consumer.messages"])
	require.EqualValues(t, 2, seen["idem.consumer.inbox.decisions"])
	require.EqualValues(t, 1, seen["idem.consumer.dead_letters"])
}
