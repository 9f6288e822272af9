package ledger

import (
	"context"
	"math"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/internal/tracing"
)

// metrics are the dispatcher's instruments. Attributes are the effect type
// and status only: effect and message ids never go on metrics.
type metrics struct {
	transitions metric.Int64Counter
	attempts    metric.Int64Counter
	refused     metric.Int64Counter
	duration    metric.Float64Histogram
	meter       metric.Meter
	unknownG    metric.Int64ObservableGauge
	oldestG     metric.Float64ObservableGauge

	// Refreshed by the sweeper, read by the observable gauges.
	unknown       atomic.Int64
	oldestDueBits atomic.Uint64 // float64 seconds
}

// durationBuckets are the bucket boundaries of the call durations, in
// seconds: the HTTP semantic conventions' boundaries, up to the default
// lease. (The SDK's defaults, 0 to 10000, are meant for milliseconds.)
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	var (
		ms  metrics
		err error
	)
	if ms.transitions, err = m.Int64Counter("idem.ledger.transitions",
		metric.WithDescription("Effects moved to a status by the dispatcher, by effect type and status.")); err != nil {
		return nil, err
	}
	if ms.attempts, err = m.Int64Counter("idem.ledger.attempts",
		metric.WithDescription("Executor calls started, by effect type.")); err != nil {
		return nil, err
	}
	if ms.refused, err = m.Int64Counter("idem.ledger.outcomes_refused",
		metric.WithDescription("Outcomes not written because the claim was no longer held (a stale owner), by effect type.")); err != nil {
		return nil, err
	}
	if ms.duration, err = m.Float64Histogram("idem.ledger.dispatch.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of executor calls, by effect type and outcome status."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if ms.unknownG, err = m.Int64ObservableGauge("idem.ledger.unknown",
		metric.WithDescription("Effects whose outcome is unknown and that wait for reconciliation or an operator.")); err != nil {
		return nil, err
	}
	if ms.oldestG, err = m.Float64ObservableGauge("idem.ledger.oldest_due_age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest due effect has been waiting for a dispatcher.")); err != nil {
		return nil, err
	}
	ms.meter = m
	return &ms, nil
}

// observe registers the gauges' callback; Run unregisters it when it ends.
func (m *metrics) observe() (metric.Registration, error) {
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(m.unknownG, m.unknown.Load())
		o.ObserveFloat64(m.oldestG, math.Float64frombits(m.oldestDueBits.Load()))
		return nil
	}, m.unknownG, m.oldestG)
}

func (m *metrics) transition(ctx context.Context, typ string, s Status, n int64) {
	m.transitions.Add(ctx, n, metric.WithAttributes(
		attribute.String("effect_type", typ), attribute.String("status", string(s))))
}

// Reasons an effect is recorded as suppressed, the reason attribute of
// idem.ledger.effects.suppressed.
const (
	// reasonRebuild: recorded during a rebuild replay, which sends nothing.
	reasonRebuild = "rebuild"
	// reasonTombstone: recorded again under an id whose settled effect
	// retention removed (its tombstone).
	reasonTombstone = "tombstone"
)

// recordMetrics are Record's instruments. Attributes are the effect type
// and the reason only.
type recordMetrics struct {
	suppressed metric.Int64Counter
}

func newRecordMetrics(mp metric.MeterProvider) (*recordMetrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(tracing.SchemaURL))
	c, err := m.Int64Counter("idem.ledger.effects.suppressed",
		metric.WithDescription("Effects recorded as suppressed, never sent, by effect type and reason: "+
			"rebuild (a rebuild replay) or tombstone (recorded again after retention removed the settled effect)."))
	if err != nil {
		return nil, err
	}
	return &recordMetrics{suppressed: c}, nil
}

func (m *recordMetrics) suppress(ctx context.Context, typ, reason string, n int64) {
	m.suppressed.Add(ctx, n, metric.WithAttributes(
		attribute.String("effect_type", typ), attribute.String("reason", reason)))
}

// suppressReason is why an effect recorded with status recorded (pending,
// or suppressed by a rebuild) was written as suppressed.
func suppressReason(recorded Status) string {
	if recorded == StatusSuppressed {
		return reasonRebuild
	}
	return reasonTombstone
}
