package deadletters

import (
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/amqpnames"
)

// Headers idem reads and writes on redriven messages.
const (
	// HistoryHeader holds a redriven message's past: an array of tables,
	// one per redrive, newest last. Each table holds the headers the
	// redrive took off the message (x-idem-reason, x-idem-error,
	// x-idem-consumer, x-idem-attempts, x-idem-attempt, the hashes, the
	// broker's x-death…) and HistoryRedrivenAt, HistoryRedrivenBy and
	// HistoryRedrivenFrom.
	HistoryHeader = amqpnames.HeaderHistory
	// HistoryRedrivenAt is when the message was redriven (a timestamp).
	HistoryRedrivenAt = amqpnames.HeaderRedrivenAt
	// HistoryRedrivenBy is who redrove it ("" when unknown).
	HistoryRedrivenBy = amqpnames.HeaderRedrivenBy
	// HistoryRedrivenFrom is the dead-letter queue it came from.
	HistoryRedrivenFrom = amqpnames.HeaderRedrivenFrom
)

// Headers the runtime sets on the copies it publishes to a retry or a
// dead-letter queue. They inform operators (and Redrive, which moves them
// into the history); the runtime itself never reads them back, since a
// publisher controls headers: attempt counts and routes live in the
// attempts table.
const (
	// HeaderReason is why the message was dead-lettered.
	HeaderReason = amqpnames.HeaderReason
	// HeaderError is the handler's error, or the dead letter's cause.
	HeaderError = amqpnames.HeaderError
	// HeaderConsumer is the consumer that dead-lettered it.
	HeaderConsumer = amqpnames.HeaderConsumer
	// HeaderAttempts is how many times it was tried, on a dead letter.
	HeaderAttempts = amqpnames.HeaderAttempts
	// HeaderAttempt is the attempt it is parked for, on a retry.
	HeaderAttempt = amqpnames.HeaderAttempt
	// HeaderPayloadHash is its payload hash, in hex.
	HeaderPayloadHash = amqpnames.HeaderPayloadHash
	// HeaderMessageID is, on a dead letter, the message id its dead-letter
	// row records: the id the consumer derived (consumer.Config.MessageID),
	// or "" when it found no usable one (the row then records "sha256:" and
	// the payload hash). Redrive matches the copy to its rows by it.
	HeaderMessageID = amqpnames.HeaderMessageID
	// HeaderStoredHash is the hash the inbox holds under its id, in hex,
	// on a payload conflict.
	HeaderStoredHash = amqpnames.HeaderStoredHash
	// HeaderOriginalExchange and HeaderOriginalRoutingKey are the route it
	// was first published with.
	HeaderOriginalExchange   = amqpnames.HeaderOriginalExchange
	HeaderOriginalRoutingKey = amqpnames.HeaderOriginalRoutingKey
)

// kept are the x-idem- headers a redriven message keeps: its original route,
// which the consumer shows to the handler as Message.Exchange and
// RoutingKey, and its history.
var kept = map[string]bool{HeaderOriginalExchange: true, HeaderOriginalRoutingKey: true, HistoryHeader: true}

// dropped are counters the broker owns: carried over, the queue the message
// goes back to would count its deliveries in the DLQ as its own.
var dropped = map[string]bool{"x-delivery-count": true, "x-acquired-count": true}

// moves reports whether a header leaves the message for its history entry:
// idem's reason, retry and bookkeeping headers, and the broker's own
// dead-letter headers.
func moves(name string) bool {
	if kept[name] {
		return false
	}
	return strings.HasPrefix(strings.ToLower(name), amqpnames.HeaderPrefix) || amqpnames.IsDeathHeader(name)
}

// redriveHeaders returns the headers a redriven copy of a message with
// headers h carries: h without the headers that moved, plus the history
// with one more entry for this redrive (the moved headers and who, when,
// from where). h is not modified.
func redriveHeaders(h amqp.Table, at time.Time, by, from string) amqp.Table {
	out := amqp.Table{}
	entry := amqp.Table{}
	for k, v := range h {
		switch {
		case dropped[strings.ToLower(k)]:
		case moves(k):
			entry[k] = v
		default:
			out[k] = v
		}
	}
	for _, k := range []string{HeaderOriginalExchange, HeaderOriginalRoutingKey} {
		if v, ok := h[k]; ok {
			entry[k] = v // the route stays on the message, and is recorded too
		}
	}
	entry[HistoryRedrivenAt] = at.UTC().Truncate(time.Second)
	entry[HistoryRedrivenBy] = by
	entry[HistoryRedrivenFrom] = from
	var history []any
	if past, ok := h[HistoryHeader].([]any); ok {
		history = append(history, past...)
	}
	out[HistoryHeader] = append(history, entry)
	return out
}

// republish is the copy of d published back to the queue: the same body,
// properties and message id, with the headers of redriveHeaders. The
// user-id property is left out: the broker checks it against the user of
// the connection that publishes.
func republish(d amqp.Delivery, headers amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
