package retention_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/retention"
)

// gauge returns the value of the gauge name that reader collects, and
// whether it has one.
func gauge(t *testing.T, reader *sdkmetric.ManualReader, name string) (float64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && m.Name == name && len(g.DataPoints) == 1 {
				return g.DataPoints[0].Value, true
			}
		}
	}
	return 0, false
}

func unix(v float64) time.Time { return time.UnixMicro(int64(v * 1e6)) }

func TestRetentionTellsWhenACleanupLastWentThrough(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := retention.Config{Pool: pool, Tables: tables, OlderThan: 30 * 24 * time.Hour, MeterProvider: mp,
		Logger: slog.New(slog.DiscardHandler)}

	failing := cfg
	failing.Tables = idem.Tables{Schema: tables.Schema + "_missing"}
	_, err := retention.Clean(t.Context(), failing)
	require.Error(t, err)
	_, ok := gauge(t, reader, "idem.retention.last_success.timestamp")
	require.False(t, ok, "a cleanup that failed is no success")

	before := time.Now()
	_, err = retention.Clean(t.Context(), cfg)
	require.NoError(t, err)
	v, ok := gauge(t, reader, "idem.retention.last_success.timestamp")
	require.True(t, ok)
	require.WithinRange(t, unix(v), before.Add(-time.Millisecond), time.Now())

	// Run says how often it cleans, and starts from its own start.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg.Interval, cfg.Jitter = 2*time.Hour, time.Hour // the first round waits: only the start is seen
	started := time.Now()
	done := make(chan error, 1)
	go func() { done <- retention.Run(ctx, cfg) }()
	require.Eventually(t, func() bool {
		v, ok := gauge(t, reader, "idem.retention.interval")
		return ok && v == 7200
	}, 15*time.Second, 10*time.Millisecond)
	v, _ = gauge(t, reader, "idem.retention.last_success.timestamp")
	require.False(t, unix(v).Before(started.Add(-time.Millisecond)), "Run starts the clock at its start")
	cancel()
	require.NoError(t, <-done)
}
