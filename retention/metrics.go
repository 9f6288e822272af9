package retention

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/internal/tracing"
)

// instrumentation names retention's meter.
const instrumentation = "github.com/idemkit/idem/retention"

// metrics are retention's two gauges, for an alert on a retention that
// stopped: when it last went through, and how often Run means it to.
// They have no attributes.
type metrics struct {
	lastSuccess metric.Float64Gauge
	interval    metric.Float64Gauge
}

func newMetrics(mp metric.MeterProvider) (metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	var (
		ms  metrics
		err error
	)
	if ms.lastSuccess, err = m.Float64Gauge("idem.retention.last_success.timestamp", metric.WithUnit("s"),
		metric.WithDescription("When a cleanup last went through every table, in seconds since the Unix epoch; "+
			"Run sets it to its own start until its first cleanup does.")); err != nil {
		return metrics{}, err
	}
	ms.interval, err = m.Float64Gauge("idem.retention.interval", metric.WithUnit("s"),
		metric.WithDescription("The time Run leaves between two cleanups (Config.Interval), without its jitter."))
	return ms, err
}

// succeeded records a cleanup that went through at t.
func (m metrics) succeeded(t time.Time) {
	m.lastSuccess.Record(context.Background(), float64(t.UnixMicro())/1e6)
}
