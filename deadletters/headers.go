package deadletters

import (
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers idem reads and writes on redriven messages.
const (
	// HistoryHeader holds a redriven message's past: an array of tables,
	// one per redrive, newest last. Each table holds the headers the
	// redrive took off the message (x-idem-reason, x-idem-error,
	// x-idem-consumer, x-idem-attempts, x-idem-attempt, the hashes, the
	// broker's x-death…) and HistoryRedrivenAt, HistoryRedrivenBy and
	// HistoryRedrivenFrom.
	HistoryHeader = "x-idem-history"
	// HistoryRedrivenAt is when the message was redriven (a timestamp).
	HistoryRedrivenAt = "x-idem-redriven-at"
	// HistoryRedrivenBy is who redrove it ("" when unknown).
	HistoryRedrivenBy = "x-idem-redriven-by"
	// HistoryRedrivenFrom is the dead-letter queue it came from.
	HistoryRedrivenFrom = "x-idem-redriven-from"
)

// Headers the runtime sets on the copies it publishes to a retry or a
// dead-letter queue. They inform operators (and Redrive, which moves them
// into the history); the runtime itself never reads them back, since a
// publisher controls headers: attempt counts and routes live in the
// attempts table.
const (
	// HeaderReason is why the message was dead-lettered.
	HeaderReason = "x-idem-reason"
	// HeaderError is the handler's error, or the dead letter's cause.
	HeaderError = "x-idem-error"
	// HeaderConsumer is the consumer that dead-lettered it.
	HeaderConsumer = "x-idem-consumer"
	// HeaderAttempts is how many times it was tried, on a dead letter.
	HeaderAttempts = "x-idem-attempts"
	// HeaderAttempt is the attempt it is parked for, on a retry.
	HeaderAttempt = "x-idem-attempt"
	// HeaderPayloadHash is its payload hash, in hex.
	HeaderPayloadHash = "x-idem-payload-hash"
	// HeaderStoredHash is the hash the inbox holds under its id, in hex,
	// on a payload conflict.
	HeaderStoredHash = "x-idem-stored-hash"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey are the route it
	// was first published with.
	HeaderOriginalExchange   = "x-idem-original-exchange"
	HeaderOriginalRoutingKey = "x-idem-original-routing-key"
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
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-idem-") || n == "x-death" ||
		strings.HasPrefix(n, "x-first-death-") || strings.HasPrefix(n, "x-last-death-")
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

// reason is why a message was dead-lettered: idem's x-idem-reason, or the
// broker's dead-letter reason (delivery_limit, rejected, expired, maxlen)
// for a message the broker dead-lettered itself.
func reason(h amqp.Table) string {
	if r, ok := h[HeaderReason].(string); ok {
		return r
	}
	if r, ok := h["x-first-death-reason"].(string); ok {
		return r
	}
	if deaths, ok := h["x-death"].([]any); ok && len(deaths) > 0 {
		if d, ok := deaths[0].(amqp.Table); ok {
			if r, ok := d["reason"].(string); ok {
				return r
			}
		}
	}
	return ""
}

// matches reports whether d is selected by o's filters.
func (o RedriveOptions) matches(d amqp.Delivery) bool {
	consumer, _ := d.Headers[HeaderConsumer].(string)
	return (o.Consumer == "" || consumer == o.Consumer) &&
		(o.MessageID == "" || d.MessageId == o.MessageID) &&
		(o.Reason == "" || reason(d.Headers) == o.Reason)
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
