package health

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instrumentation names the meter of the readiness gauge.
const instrumentation = "github.com/idemkit/idem/health"

// ObserveReady registers the gauge idem.health.ready on mp (the global
// provider when nil), for alerts on what the probes answer: at each
// collection it asks r for its Health and reports 1 when it is ready, 0
// when it is not, with the attribute component (Status.Component). A
// Status without a Component is not reported: a Reporter returns one while
// it has nothing to say yet (a consumer before it first runs).
//
// The consumer and the ledger dispatcher register themselves (with their
// Config's MeterProvider); call it for a Reporter of your own, such as the
// Database of an HTTP edge. Unregister the result to stop reporting.
func ObserveReady(mp metric.MeterProvider, r Reporter) (metric.Registration, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation)
	g, err := m.Int64ObservableGauge("idem.health.ready",
		metric.WithDescription("1 while the component is ready (what /readyz answers for it), 0 while it is not."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := r.Health()
		if s.Component == "" {
			return nil
		}
		var v int64
		if s.Ready {
			v = 1
		}
		o.ObserveInt64(g, v, metric.WithAttributes(attribute.String("component", s.Component)))
		return nil
	}, g)
}
