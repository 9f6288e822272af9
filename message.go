package idem

import "time"

// Message is one message as every part of idem sees it: the queue and
// stream sources build it once from what the broker delivered, a replay from
// what it read, consumer.Process from what its caller passes; the runtime
// derives its identity (ID, Hash, BusinessKey) in place, and the handler
// receives the same value. consumer.Message is this type.
//
// A handler may read every field and must not keep the message, or its
// Body or Headers, after it returns.
type Message struct {
	// ID is the message's identity in the inbox: what consumer.Config.
	// MessageID derives, by default the MessageID property.
	ID string
	// MessageID is the message-id property as the source delivered it (the
	// AMQP message-id, a stream message's message-id).
	MessageID string
	// Body is the raw payload.
	Body []byte
	// Headers are the AMQP headers (a stream message's application
	// properties). Never nil once the runtime has the message.
	Headers map[string]any
	// ContentType is the content-type property.
	ContentType string
	// CorrelationID is the correlation-id property.
	CorrelationID string
	// Exchange is the exchange the message was published to; for a message
	// back from the retry queue, the one it was first published to.
	Exchange string
	// RoutingKey is the routing key the message was published with; for a
	// message back from the retry queue, the first one.
	RoutingKey string
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// DeliveryCount is x-delivery-count, set by quorum queues on
	// redelivery; 0 otherwise.
	DeliveryCount int64
	// Attempt is 1 for the first processing attempt and grows with each
	// retry. The runtime counts it; headers never set it.
	Attempt int
	// Hash is the payload hash stored in the inbox.
	Hash Hash
	// BusinessKey is set when consumer.Config.BusinessKey is.
	BusinessKey string
	// Source is the queue or stream the message came from.
	Source string
	// Offset is the stream offset; meaningful only when HasOffset.
	Offset int64
	// HasOffset reports whether the message came from a stream.
	HasOffset bool
	// Timestamp is the publisher's timestamp, when set.
	Timestamp time.Time
	// ReceivedAt is when the runtime took the delivery from the broker; for
	// streams and replays, when it read the message's batch; for
	// consumer.Process, the time its caller set, or when Process was
	// called. Now minus ReceivedAt is the time the message has spent inside
	// idem.
	ReceivedAt time.Time
}
