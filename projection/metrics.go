package projection

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tracing"
)

const instrumentation = "github.com/idemkit/idem/projection"

// metrics are the guards' instruments. Attributes are the projection, the
// decision and the processing mode: entity keys never go on metrics.
type metrics struct {
	events metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	events, err := m.Int64Counter("idem.projection.events",
		metric.WithDescription("Events a projection's version guard decided on, by decision: applied, applied_gap, "+
			"stale (a no-op), parked, unparked, gap_failed."))
	if err != nil {
		return nil, err
	}
	return &metrics{events: events}, nil
}

// The values of the decision attribute.
const (
	countApplied    = "applied"     // the next version, applied
	countAppliedGap = "applied_gap" // a version after a gap, applied (GapApply)
	countStale      = "stale"       // not newer than the projection: a no-op
	countParked     = "parked"      // after a gap, kept aside (GapPark)
	countUnparked   = "unparked"    // a parked event applied once its turn came
	countGapFailed  = "gap_failed"  // after a gap, failed (GapFail)
)

// count adds one event with decision to the counter.
func (m *metrics) count(ctx context.Context, projection, decision string) {
	mode := string(idem.ModeFrom(ctx))
	if mode == "" {
		mode = "live"
	}
	m.events.Add(ctx, 1, metric.WithAttributes(attribute.String("idem.projection", projection),
		attribute.String("decision", decision), attribute.String("idem.mode", mode)))
}
