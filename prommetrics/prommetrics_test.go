package prommetrics_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/prommetrics"
)

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestServeLeavesTheGlobalProviderAloneUntilAsked(t *testing.T) {
	before := otel.GetMeterProvider()
	s, err := prommetrics.Serve("127.0.0.1:0", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Same(t, before, otel.GetMeterProvider())
	require.NotNil(t, s.MeterProvider())

	// Instruments as a component given the provider in its Config creates them.
	m := s.MeterProvider().Meter("github.com/idemkit/idem/consumer")
	n, err := m.Int64Counter("idem.consumer.duplicates")
	require.NoError(t, err)
	n.Add(context.Background(), 2)
	require.Regexp(t, `(?m)^idem_consumer_duplicates_total\{.*\} 2$`, scrape(t, s.Addr()))
}

// The test sets the global MeterProvider, as a worker asks with SetGlobal:
// it is the only test in this package that does.
func TestServeExportsGlobalInstrumentsWithPrometheusNames(t *testing.T) {
	s, err := prommetrics.Serve("127.0.0.1:0", slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	s.SetGlobal()

	// Instruments as idem's packages create them: from the global provider.
	m := otel.GetMeterProvider().Meter("github.com/idemkit/idem/consumer")
	messages, err := m.Int64Counter("idem.consumer.messages")
	require.NoError(t, err)
	messages.Add(context.Background(), 3, metric.WithAttributes(attribute.String("outcome", "processed")))
	commit, err := m.Float64Histogram("idem.consumer.commit.duration", metric.WithUnit("s"))
	require.NoError(t, err)
	commit.Record(context.Background(), 0.002)
	requests, err := m.Int64Counter("idem.http_keys.started", metric.WithUnit("{request}"))
	require.NoError(t, err)
	requests.Add(context.Background(), 1)

	body := scrape(t, s.Addr())
	require.Regexp(t, `(?m)^idem_consumer_messages_total\{.*outcome="processed".*\} 3$`, body)
	require.Regexp(t, `(?m)^idem_consumer_commit_duration_seconds_count\{.*\} 1$`, body)
	require.Regexp(t, `(?m)^idem_http_keys_started_total\{.*\} 1$`, body)
	require.Contains(t, body, "go_goroutines")
}

func TestServeWithoutAddressIsOff(t *testing.T) {
	s, err := prommetrics.Serve("", nil)
	require.NoError(t, err)
	require.Empty(t, s.Addr())
	require.Nil(t, s.MeterProvider())
	s.SetGlobal() // does nothing
	require.NoError(t, s.Close())
}
