package httpinbox

import (
	"context"
	"fmt"
	"time"

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
// by method, scheme, route and status. The gauges are read from the tables
// when the metrics are collected.
type metrics struct {
	meter          metric.Meter
	inProgAge      metric.Float64ObservableGauge // age of the oldest started key
	unknownAge     metric.Float64ObservableGauge // age of the oldest unknown outcome
	opInProgAge    metric.Float64ObservableGauge // age of the oldest operation accepted or running
	opUnknownAge   metric.Float64ObservableGauge // age of the oldest unknown operation
	duration       httpconv.ServerRequestDuration
	started        metric.Int64Counter // handler runs begun (first requests and takeovers)
	replayed       metric.Int64Counter // stored responses sent again
	conflict       metric.Int64Counter // keys reused with a different fingerprint (422)
	inProgress     metric.Int64Counter // requests answered 409
	expired        metric.Int64Counter // records removed because they expired and were forgotten
	expiredRefused metric.Int64Counter // requests refused because their key expired (422)
	unknown        metric.Int64Counter // outcomes the server cannot prove

	signatureRejected metric.Int64Counter // webhooks refused for their signature, by reason
	bulkItems         metric.Int64Counter // bulk items answered, by item operation and status
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
	m.expired = counter("idem.http_keys.expired", "Idempotency key records removed after they expired and their tombstone passed.")
	m.expiredRefused = counter("idem.http_keys.expired_refused",
		"Requests refused (422) because their idempotency key expired while its tombstone lasts.")
	m.unknown = counter("idem.http_keys.unknown", "Requests whose outcome the server cannot prove.")
	m.bulkItems = counter("idem.bulk.items",
		"Items of bulk requests answered, by item operation and status (accepted, already_accepted, rejected, failed).")
	m.signatureRejected = counter("idem.webhooks.rejected",
		"Webhook requests refused (401) because their signature was missing, invalid or stale, by reason.")
	gauge := func(name, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return g
	}
	m.inProgAge = gauge("idem.http_keys.oldest_in_progress_age",
		"Age of the oldest idempotency key started under a live lease: a request running, or one that crashed and still holds its lease.")
	m.unknownAge = gauge("idem.http_keys.oldest_unknown_age",
		"How long the oldest unknown outcome has waited for an operator (idem http-keys resolve).")
	m.opInProgAge = gauge("idem.http_operations.oldest_in_progress_age",
		"Age of the oldest long-running operation still accepted or running, among those a worker moves (not those following a ledger effect).")
	m.opUnknownAge = gauge("idem.http_operations.oldest_unknown_age",
		"How long the oldest unknown long-running operation a worker moves has waited for a reconciler or an operator (idem operations resolve).")
	m.meter = meter
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

// gaugeTimeout bounds the query that reads the gauges at collection.
const gaugeTimeout = 5 * time.Second

// observeAges registers the callback that reads the two key gauges with
// ages when the metrics are collected. It stays registered for the life of
// the meter provider, like the middleware it belongs to.
func (m metrics) observeAges(ages func(context.Context) (inProgress, unknown time.Duration, err error)) error {
	return m.observePair(m.inProgAge, m.unknownAge, ages)
}

// observeOperationAges registers, like observeAges, the callback that reads
// the two operation gauges with ages (Operations.ages). It is a callback of
// its own: the key gauges report even when the operations cannot be read.
func (m metrics) observeOperationAges(ages func(context.Context) (inProgress, unknown time.Duration, err error)) error {
	return m.observePair(m.opInProgAge, m.opUnknownAge, ages)
}

// observePair registers a callback observing the two ages reads into
// inProgress and unknown, bounded by gaugeTimeout.
func (m metrics) observePair(inProgAge, unknownAge metric.Float64ObservableGauge,
	ages func(context.Context) (inProgress, unknown time.Duration, err error)) error {
	_, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, gaugeTimeout)
		defer cancel()
		inProgress, unknown, err := ages(ctx)
		if err != nil {
			return err
		}
		o.ObserveFloat64(inProgAge, inProgress.Seconds())
		o.ObserveFloat64(unknownAge, unknown.Seconds())
		return nil
	}, inProgAge, unknownAge)
	if err != nil {
		return fmt.Errorf("httpinbox: register gauges: %w", err)
	}
	return nil
}

// opt is the attribute set of operation.
func (metrics) opt(operation string) metric.AddOption {
	return metric.WithAttributes(attribute.String("operation", operation))
}

// statusOpt is the attribute set of an item operation and an item status.
func (metrics) statusOpt(operation, status string) metric.AddOption {
	return metric.WithAttributes(attribute.String("operation", operation), attribute.String("status", status))
}

// reasonOpt is the attribute set of operation and a refusal's reason.
func (metrics) reasonOpt(operation, reason string) metric.AddOption {
	return metric.WithAttributes(attribute.String("operation", operation), attribute.String("reason", reason))
}
