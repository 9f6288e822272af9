package engine

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/tracing"
)

// startSpan starts the process span of one message, a child of the trace
// context found in its headers (W3C trace context by default), named and
// attributed after the messaging semantic conventions: for a queue the
// destination is the exchange the message was published to (with its
// routing key and the delivery tag), for a stream the stream.
func (t *Telemetry) startSpan(ctx context.Context, it *Item, batchSize int) (context.Context, trace.Span) {
	if len(it.Headers) > 0 {
		ctx = tracing.Propagator(nil).Extract(ctx, tracing.AMQPCarrier(it.Headers))
	}
	ctx, span := t.tracer.Start(ctx, "process "+it.Source, t.spanStart...)
	if !span.IsRecording() {
		return ctx, span // tracing is off: build no attributes
	}
	destination := it.Exchange
	if it.HasOffset {
		destination = it.Source
	}
	span.SetAttributes(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(destination),
		semconv.MessagingDestinationSubscriptionName(it.Source),
		semconv.MessagingConsumerGroupName(t.name),
		semconv.MessagingMessageID(it.ID),
		semconv.MessagingMessageBodySize(len(it.Body)),
		semconv.MessagingBatchMessageCount(batchSize),
	)
	if it.ConversationID != "" {
		span.SetAttributes(semconv.MessagingMessageConversationID(it.ConversationID))
	}
	if it.RoutingKey != "" {
		span.SetAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(it.RoutingKey))
	}
	if it.DeliveryTag != 0 {
		span.SetAttributes(semconv.MessagingRabbitMQMessageDeliveryTag(int(it.DeliveryTag)))
	}
	if it.HasOffset {
		span.SetAttributes(attribute.String("messaging.rabbitmq.stream.offset", strconv.FormatInt(it.Offset, 10)))
	}
	return ctx, span
}

// endSpan records the message's outcome on its span.
func endSpan(span trace.Span, r Result) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attribute.String("idem.outcome", r.Outcome.String()))
	if r.Reason != "" {
		span.SetAttributes(attribute.String("idem.dead_letter.reason", r.Reason))
	}
	if r.Err != nil && r.Outcome != Processed {
		span.SetStatus(codes.Error, r.Err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(r.Outcome.String()))
	}
	span.End()
}
