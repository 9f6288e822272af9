package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// readyPoints returns the idem.health.ready points reader collects, by component.
func readyPoints(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "idem.health.ready" {
				for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					c, _ := p.Attributes.Value("component")
					out[c.AsString()] = p.Value
				}
			}
		}
	}
	return out
}

// The consumer's readiness is a gauge an alert reads (IdemConsumerNotReady):
// nothing before it runs, 1 once it consumes, nothing after it stopped.
func TestConsumerReadinessIsExportedForAlerts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	reader := sdkmetric.NewManualReader()
	c := e.newConsumer(func(context.Context, pgx.Tx, *Message) error { return nil }, func(cfg *Config) {
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	require.Empty(t, readyPoints(t, reader), "a consumer that never ran says nothing")
	stop := start(t, c)
	waitFor(t, 20*time.Second, "the consumer is ready", func() bool { return c.Health().Ready })
	require.Equal(t, map[string]int64{"consumer test": 1}, readyPoints(t, reader))
	stop()
	require.Empty(t, readyPoints(t, reader), "a consumer that stopped says nothing")
}

// A partitioned consumer reports how many of its partitions no process
// holds (IdemPartitionWithoutHolder), under the consumer's attributes.
func TestPartitionedConsumerReportsPartitionsWithoutAHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testbroker.PartitionsAtEnd(t, e.queue, 2)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	edit := func(c *Config) {
		c.Partitions = 2
		c.OrderingKey = func(m *Message) string { return m.ID }
		c.MeterProvider = mp
	}
	e.declare(edit)
	c := e.newConsumer(e.effectHandler(), edit)
	start(t, c)
	waitFor(t, 15*time.Second, "ready", func() bool { return c.Health().Ready })
	want := attribute.NewSet(semconv.MessagingSystemRabbitMQ, semconv.MessagingConsumerGroupName("test"),
		semconv.MessagingDestinationSubscriptionName(e.queue))
	waitFor(t, 15*time.Second, "both partitions held", func() bool {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "idem.consumer.partitions.unheld" {
					p := m.Data.(metricdata.Gauge[int64]).DataPoints[0]
					require.Equal(t, want, p.Attributes)
					return p.Value == 0
				}
			}
		}
		return false
	})
}
