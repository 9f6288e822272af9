package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/amqpurl"
	"github.com/idemkit/idem/internal/tracing"
)

// Publishing is the request of an effect that AMQPExecutor publishes: record
// it as Effect.Request.
type Publishing struct {
	// Exchange is where the message goes; "" is the default exchange.
	Exchange string `json:"exchange"`
	// RoutingKey routes the message (the queue name on the default exchange).
	RoutingKey string `json:"routing_key"`
	// ContentType is the message's content type. Default: application/json.
	ContentType string `json:"content_type,omitempty"`
	// Headers are added to the message's headers.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the message body.
	Body []byte `json:"body"`
	// CorrelationID is the message's correlation-id property. Optional.
	CorrelationID string `json:"correlation_id,omitempty"`
}

// AMQPConfig configures an AMQPExecutor.
type AMQPConfig struct {
	// ConnectionName is the connection's name in the broker's management
	// UI and rabbitmqctl list_connections (with the default Dial). Default:
	// "idem:ledger".
	ConnectionName string
	// Dial opens the connection to one node. A call waits for it at most
	// until the call's deadline (a later connection is closed), but cannot
	// interrupt it. Default: amqp.DialConfig, with the connect and the
	// handshake bounded by 10 seconds and by the deadline of the call that
	// dials.
	Dial func(url string) (*amqp.Connection, error)
	// Logger receives reconnection logs. Default: slog.Default().
	Logger *slog.Logger
	// URL is the broker's AMQP URL when it is one node. Set it or URLs.
	URL string
	// TimeOrderedMessageIDs gives each message a time-ordered message id
	// (a UUIDv7, see TimeOrderedMessageID) made from the time the effect
	// was recorded and its effect id, instead of the effect id itself:
	// the same on every attempt, and inserted at the right edge of the
	// consumers' inbox index, which costs them a tenth of the write-ahead
	// log of random ids (BENCHMARKS.md). Switch it on for a new outbox, or
	// when no effect of this executor awaits an attempt (idem ledger
	// stats): a message published under the effect id and again under the
	// new id after the switch is two messages to a consumer. Default:
	// false, the message id is the effect id.
	TimeOrderedMessageIDs bool
	// URLs are the nodes of a RabbitMQ cluster, one URL each: each
	// connection goes to the first of them, in a shuffled order, that
	// answers, and after the connection dies the next one dials the list
	// again.
	URLs []string
}

// TimeOrderedMessageID returns the message id AMQPConfig.TimeOrderedMessageIDs
// gives an effect recorded at recordedAt with id effectID: a UUID of
// version 7 whose time is recordedAt's (in milliseconds) and whose other
// 74 bits come from SHA-256 over the effect id. The same effect gets the
// same id on every attempt and in every process.
func TimeOrderedMessageID(recordedAt time.Time, effectID string) string {
	var u uuid.UUID
	ms := uint64(recordedAt.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	sum := sha256.Sum256([]byte("idem.ledger.message\x00" + effectID))
	copy(u[6:], sum[:10])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // the RFC 9562 variant
	return u.String()
}

// AMQPExecutor publishes effects whose Request is a Publishing: the
// transactional outbox. Each message is persistent, published with the
// mandatory flag on a channel in confirm mode, and carries the effect id as
// its message id (or a time-ordered id made from it, with
// AMQPConfig.TimeOrderedMessageIDs), on which idem consumers downstream
// deduplicate, and the effect's trace context in its headers.
//
// A confirm (ack) means succeeded; a nack or a returned (unroutable) message
// means failed_retryable (after a nack, the next publish opens a new
// connection); a confirm that never arrives means unknown. Because
// the message id is stable, AMQPExecutor declares itself deduplicating: an
// unknown publish is published again with the same message id, and a
// consumer that dedups on it processes it once.
//
// The executor owns its connection and channel: it dials on first use and
// again after the connection or channel closes. Close it when done.
type AMQPExecutor struct {
	cfg   AMQPConfig
	nodes []string // URL or URLs
	log   *slog.Logger

	mu      sync.Mutex // guards sess, dialing and closed; never held across a call into the client
	sess    *amqpSession
	dialing chan struct{} // closed when the dial in progress ends; nil when none is
	closed  bool
}

// NewAMQPExecutor returns an executor for cfg. It connects on first use.
// It refuses a malformed URL, and a URL that holds several (use URLs).
func NewAMQPExecutor(cfg AMQPConfig) (*AMQPExecutor, error) {
	nodes, err := amqpurl.Nodes(cfg.URL, cfg.URLs)
	if err != nil {
		return nil, fmt.Errorf("ledger: AMQPConfig: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &AMQPExecutor{cfg: cfg, nodes: nodes, log: cfg.Logger}, nil
}

// DeduplicatesByKey returns true: the message id is the effect id (or made
// from it), the same on every attempt, and idem consumers deduplicate on it.
func (e *AMQPExecutor) DeduplicatesByKey() bool { return true }

// Close closes the connection, waiting 5 seconds for the broker's answer
// (a broker that stopped reading but still sends heartbeats holds it until
// the client's next heartbeat write times out, a few seconds more). Publishes in progress end as unknown; a dial in progress closes
// its connection when it ends.
func (e *AMQPExecutor) Close() error {
	e.mu.Lock()
	e.closed = true
	s := e.sess
	e.sess = nil
	e.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.close()
}

// Execute publishes call's Publishing and waits for the broker's confirm,
// in a producer span whose context it writes into the message's headers
// (traceparent, and whatever else the application's propagator writes), so
// the consumer continues the effect's trace.
func (e *AMQPExecutor) Execute(ctx context.Context, call Call) (Result, error) {
	var p Publishing
	if err := json.Unmarshal(call.Request, &p); err != nil {
		return Result{Status: StatusFailedTerminal}, fmt.Errorf("ledger: amqp %s: request is not a Publishing: %w", call.EffectID, err)
	}
	name, attrs := publishAttrs(p, call)
	ctx, span := startCallSpan(ctx, name, trace.SpanKindProducer, attrs...)
	res, errorType, err := e.publish(ctx, p, call)
	endCallSpan(span, res, errorType, err)
	return res, err
}

// publish sends p as the message of call and waits for its confirm;
// errorType names a failure for the span.
func (e *AMQPExecutor) publish(ctx context.Context, p Publishing, call Call) (Result, string, error) {
	s, err := e.session(ctx)
	if err != nil {
		return Result{Status: StatusFailedRetryable}, "connect", fmt.Errorf("ledger: amqp %s: connect: %w", call.EffectID, err)
	}
	trace.SpanFromContext(ctx).SetAttributes(s.server...)
	headers := amqp.Table{}
	for k, v := range p.Headers {
		headers[k] = v
	}
	tracing.Propagator(nil).Inject(ctx, tracing.AMQPCarrier(headers))
	if p.ContentType == "" {
		p.ContentType = "application/json"
	}
	id := call.EffectID
	if e.cfg.TimeOrderedMessageIDs {
		id = TimeOrderedMessageID(call.RecordedAt, call.EffectID)
	}
	msg := amqp.Publishing{
		MessageId:     id,
		CorrelationId: p.CorrelationID,
		Type:          call.Type,
		ContentType:   p.ContentType,
		DeliveryMode:  amqp.Persistent,
		Timestamp:     time.Now(),
		Headers:       headers,
		Body:          p.Body,
	}
	dc, err := s.publish(ctx, p.Exchange, p.RoutingKey, msg)
	switch {
	case errors.Is(err, errInterrupted):
		return Result{Status: StatusUnknown}, "publish_interrupted", fmt.Errorf("ledger: amqp %s: publish: %w", call.EffectID, err)
	case errors.As(err, new(errBlocked)):
		return Result{Status: StatusFailedRetryable}, "blocked", fmt.Errorf("ledger: amqp %s: publish: %w", call.EffectID, err)
	case err != nil:
		// Publish failed in the client: nothing was sent.
		return Result{Status: StatusFailedRetryable}, "publish", fmt.Errorf("ledger: amqp %s: publish: %w", call.EffectID, err)
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return Result{Status: StatusUnknown}, "no_confirm", fmt.Errorf("ledger: amqp %s: no confirm: %w", call.EffectID, ctx.Err())
	}
	if text, returned := s.returnOf(id); returned {
		return Result{Status: StatusFailedRetryable}, "returned", fmt.Errorf("ledger: amqp %s: returned unroutable: %s", call.EffectID, text)
	}
	if !dc.Acked() {
		if s.dead() {
			return Result{Status: StatusUnknown}, "channel_closed", fmt.Errorf("ledger: amqp %s: channel closed before the confirm", call.EffectID)
		}
		s.nacked.Store(true)
		return Result{Status: StatusFailedRetryable}, "nacked", fmt.Errorf("ledger: amqp %s: nacked by the broker", call.EffectID)
	}
	return Result{Status: StatusSucceeded}, "", nil
}

// publishAttrs returns the name and the messaging attributes of the span
// that publishes p. The destination follows the RabbitMQ convention for
// producers ("exchange:routing key", either alone when the other is empty,
// amq.default when both are); the span name uses the exchange, or the
// routing key on the default exchange (where it names a queue), so that
// routing keys holding ids do not end up in span names.
func publishAttrs(p Publishing, call Call) (string, []attribute.KeyValue) {
	dest := p.Exchange
	switch {
	case p.Exchange != "" && p.RoutingKey != "":
		dest = p.Exchange + ":" + p.RoutingKey
	case p.Exchange == "" && p.RoutingKey != "":
		dest = p.RoutingKey
	case p.Exchange == "":
		dest = "amq.default"
	}
	name := "publish " + p.Exchange
	if p.Exchange == "" {
		name = "publish " + dest
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(dest),
		semconv.MessagingMessageID(call.EffectID),
		semconv.MessagingMessageBodySize(len(p.Body)),
	}
	if p.RoutingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(p.RoutingKey))
	}
	if p.CorrelationID != "" {
		attrs = append(attrs, semconv.MessagingMessageConversationID(p.CorrelationID))
	}
	return name, attrs
}
