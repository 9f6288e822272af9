package partlease

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// A member that holds no partition (here a bare session on the member
// lock, as a process that joined and hung would) leaves its share without
// a holder: the gauge says how many, for an alert, until it goes.
func TestPartitionsWithoutAHolderAreCountedForAnAlert(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	key := t.Name()
	reader := sdkmetric.NewManualReader()
	l, err := New(Config{Key: key, Partitions: 4, Conn: pool.Config().ConnConfig, Interval: 100 * time.Millisecond,
		Logger: testrun.Logger(), MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Attributes: []attribute.KeyValue{attribute.String("messaging.consumer.group.name", "billing")}})
	require.NoError(t, err)
	unheld := func() (int64, bool) {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "idem.consumer.partitions.unheld" {
					p := m.Data.(metricdata.Gauge[int64]).DataPoints[0]
					require.Equal(t, attribute.NewSet(attribute.String("messaging.consumer.group.name", "billing")), p.Attributes)
					return p.Value, true
				}
			}
		}
		return 0, false
	}
	_, ok := unheld()
	require.False(t, ok, "nothing before it runs")

	hung, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	require.NoError(t, err)
	defer func() { _ = hung.Close(ctx) }()
	_, err = hung.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, l.member)
	require.NoError(t, err)
	w := newWorld()
	stop := testrun.Start(t, func(ctx context.Context) error { return l.Run(ctx, w.consume("a")) })
	require.Eventually(t, func() bool { n, ok := unheld(); return ok && n == 2 && len(l.Status().Held) == 2 },
		15*time.Second, 20*time.Millisecond, "two members, one of which holds nothing: 2 of 4 unheld")

	require.NoError(t, hung.Close(ctx)) // the hung member goes: the other takes its share
	require.Eventually(t, func() bool { n, ok := unheld(); return ok && n == 0 }, 15*time.Second, 20*time.Millisecond)
	stop()
	_, ok = unheld()
	require.False(t, ok, "nothing after it stopped")
}
