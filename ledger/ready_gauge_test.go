package ledger_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/ledger"
)

// The dispatcher's readiness is a gauge an alert reads, while it runs.
func TestDispatcherReadinessIsExportedWhileItRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	reader := sdkmetric.NewManualReader()
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: f.pool, Tables: f.tables, Executors: noop(),
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	ready := func() map[string]int64 {
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
	require.Empty(t, ready())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Eventually(t, func() bool { return d.Health().Ready }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, map[string]int64{"ledger dispatcher": 1}, ready())
	cancel()
	require.NoError(t, <-done)
	require.Empty(t, ready())
}
