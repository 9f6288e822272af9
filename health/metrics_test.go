package health_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/health"
)

// readyGauge returns the idem.health.ready points reader collects, by component.
func readyGauge(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.health.ready" {
				continue
			}
			for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				c, _ := p.Attributes.Value("component")
				out[c.AsString()] = p.Value
			}
		}
	}
	return out
}

func TestReadinessIsAGaugeAnAlertCanRead(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var ready, started atomic.Bool
	reg, err := health.ObserveReady(mp, health.ReporterFunc(func() health.Status {
		if !started.Load() {
			return health.Status{}
		}
		return health.Status{Component: "consumer billing", Ready: ready.Load(), Live: true}
	}))
	require.NoError(t, err)
	require.Empty(t, readyGauge(t, reader), "nothing to say before it starts")
	started.Store(true)
	require.Equal(t, map[string]int64{"consumer billing": 0}, readyGauge(t, reader))
	ready.Store(true)
	require.Equal(t, map[string]int64{"consumer billing": 1}, readyGauge(t, reader))
	require.NoError(t, reg.Unregister())
	require.Empty(t, readyGauge(t, reader))
}
