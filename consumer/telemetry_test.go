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
	"go.opentelemetry.io/otel/trace"
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
	counts := map[string]int64{}
	for _, dp := range byName["idem.consumer.messages"].(metricdata.Sum[int64]).DataPoints {
		outcome, _ := dp.Attributes.Value("outcome")
		require.Equal(t, attribute.NewSet(attribute.String("idem.consumer", "test"),
			attribute.String("messaging.destination.name", e.queue), attribute.KeyValue{Key: "outcome", Value: outcome}), dp.Attributes)
		counts[outcome.AsString()] += dp.Value
	}
	base := attribute.NewSet(attribute.String("idem.consumer", "test"), attribute.String("messaging.destination.name", e.queue))
	require.Equal(t, map[string]int64{"processed": 1, "duplicate": 1, "dead_lettered": 1}, counts)
	size := byName["idem.consumer.batch.size"].(metricdata.Histogram[int64]).DataPoints
	require.Len(t, size, 1)
	require.Equal(t, base, size[0].Attributes)
	require.GreaterOrEqual(t, size[0].Sum, int64(3), "every message was in a batch transaction (a rerun counts again)")
	handler := byName["idem.consumer.handler.duration"].(metricdata.Histogram[float64]).DataPoints
	require.Len(t, handler, 1)
	require.Equal(t, base, handler[0].Attributes)
	require.GreaterOrEqual(t, handler[0].Count, uint64(2), "each new message ran its handler")
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
		id, _ := attrs.Value("messaging.message.id")
		outcome, _ := attrs.Value("idem.outcome")
		if outcome.AsString() != "unresolved" {
			outcomes[id.AsString()] = append(outcomes[id.AsString()], outcome.AsString())
		}
	}
	require.ElementsMatch(t, []string{"processed", "duplicate"}, outcomes["ok"])
	require.Equal(t, []string{"dead_lettered"}, outcomes["bad"])
	require.Len(t, outcomes, 2)
}
