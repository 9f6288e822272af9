package tracing_test

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// A consumer continues the trace of a delivery; what it records in the
// ledger keeps the trace beside the effect; the executor that carries the
// effect out injects it into the message it publishes.
func Example() {
	delivery := amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ctx := tracing.Propagator(nil).Extract(context.Background(), tracing.AMQPCarrier(delivery))

	saved := tracing.Save(ctx) // stored with the effect
	fmt.Println(saved["traceparent"])

	later := tracing.Restore(context.Background(), saved) // in the dispatcher
	out := amqp.Table{}
	tracing.Propagator(nil).Inject(later, tracing.AMQPCarrier(out))
	fmt.Println(trace.SpanContextFromContext(later).TraceID(), out["traceparent"] == delivery["traceparent"])
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// 4bf92f3577b34da6a3ce929d0e0e4736 true
}
