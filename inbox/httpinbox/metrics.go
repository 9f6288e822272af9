package httpinbox

import (
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"

	"github.com/idemkit/idem/internal/tracing"
)

// instrumentation is the instrumentation scope of the spans and metrics.
const instrumentation = "github.com/idemkit/idem/inbox/httpinbox"

// metrics are the middleware's instruments. Each counter carries the route's
// operation as its only attribute (cleanup counts carry none); keys never
// become attributes. duration is the semantic conventions' request duration,
// by method, scheme, route and status.
type metrics struct {
	duration   httpconv.ServerRequestDuration
	started    metric.Int64Counter // handler runs begun (first requests and takeovers)
	replayed   metric.Int64Counter // stored responses sent again
	conflict   metric.Int64Counter // keys reused with a different fingerprint (422)
	inProgress metric.Int64Counter // requests answered 409
	expired    metric.Int64Counter // records removed because they expired
	unknown    metric.Int64Counter // outcomes the server cannot prove
}

func newMetrics(mp metric.MeterProvider) (metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	var (
		m    metrics
		errs []error
	)
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{request}"))
		errs = append(errs, err)
		return c
	}
	m.started = counter("idem.http_keys.started", "Requests whose handler ran under a new or taken-over idempotency key.")
	m.replayed = counter("idem.http_keys.replayed", "Requests answered with a stored response.")
	m.conflict = counter("idem.http_keys.conflict", "Idempotency keys reused with a different request (422).")
	m.inProgress = counter("idem.http_keys.in_progress", "Requests answered 409 because their key was in progress.")
	m.expired = counter("idem.http_keys.expired", "Idempotency key records removed after they expired.")
	m.unknown = counter("idem.http_keys.unknown", "Requests whose outcome the server cannot prove.")
	var err error
	m.duration, err = httpconv.NewServerRequestDuration(meter)
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return metrics{}, fmt.Errorf("httpinbox: create counters: %w", err)
		}
	}
	return m, nil
}

// opt is the attribute set of operation.
func (metrics) opt(operation string) metric.AddOption {
	return metric.WithAttributes(attribute.String("operation", operation))
}
