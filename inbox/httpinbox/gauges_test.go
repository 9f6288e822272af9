package httpinbox_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/inbox/httpinbox"
)

func TestGaugesReportTheOldestKeyInProgressAndTheOldestUnknown(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	f := newFixture(t, httpinbox.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	gauges := func() map[string]float64 { return gaugeValues(t, reader) }
	require.Equal(t, map[string]float64{
		"idem.http_keys.oldest_in_progress_age":       0,
		"idem.http_keys.oldest_unknown_age":           0,
		"idem.http_operations.oldest_in_progress_age": 0,
		"idem.http_operations.oldest_unknown_age":     0,
	}, gauges(), "nothing waits")

	var runs atomic.Int64
	require.Equal(t, http.StatusGatewayTimeout, post(unknownHandler(f, &runs), "k1", `{}`).Code)
	require.Equal(t, http.StatusCreated, post(f.handler(httpinbox.Route{}), "k2", `{"amount": 1}`).Code)
	require.Equal(t, http.StatusCreated, post(f.handler(httpinbox.Route{}), "k3", `{"amount": 1}`).Code)
	_, err := f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+`
		SET completed_at = now() - interval '2 hours' WHERE idempotency_key = 'k1'`)
	require.NoError(t, err)
	// k2 runs under its lease for an hour now; k3, older, was released
	// after a failed attempt and waits for its client: not in progress.
	_, err = f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+`
		SET state = 'started', created_at = now() - interval '1 hour', completed_at = NULL,
			lock_owner = gen_random_uuid(), locked_until = now() + interval '1 minute' WHERE idempotency_key = 'k2'`)
	require.NoError(t, err)
	_, err = f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+`
		SET state = 'started', created_at = now() - interval '3 hours', completed_at = NULL,
			locked_until = now() - interval '1 minute' WHERE idempotency_key = 'k3'`)
	require.NoError(t, err)
	g := gauges()
	require.InDelta(t, 3600, g["idem.http_keys.oldest_in_progress_age"], 60)
	require.InDelta(t, 7200, g["idem.http_keys.oldest_unknown_age"], 60)

	s, err := f.keys().Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[httpinbox.KeyState]int64{httpinbox.KeyStarted: 2, httpinbox.KeyUnknown: 1}, s.Counts)
	require.InDelta(t, time.Hour, s.OldestInProgress, float64(time.Minute))
	require.InDelta(t, 2*time.Hour, s.OldestUnknown, float64(time.Minute))
}
