package streamio

import (
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
)

// Record is one message read from a stream.
type Record struct {
	// Offset is the record's position in the stream.
	Offset int64
	// Timestamp is the message's AMQP 1.0 creation-time property (Publish
	// sets it), zero when the publisher did not set one. The Go stream
	// client drops the chunk timestamp, so there is nothing better.
	Timestamp time.Time
	// MessageID is the AMQP 1.0 message-id, formatted with %v when it is not
	// a string; empty when absent.
	MessageID string
	// Properties are the AMQP 1.0 properties idem uses.
	Properties Properties
	// ApplicationProperties are the message's application properties, nil
	// when absent.
	ApplicationProperties map[string]any
	// Body is the message's data sections concatenated (usually one), or its
	// amqp-value when that is a string or []byte.
	Body []byte
}

// Properties are the AMQP 1.0 message properties carried by a Record besides
// the message id and creation time.
type Properties struct {
	// ContentType is the body's MIME type.
	ContentType string
	// CorrelationID is the correlation-id, formatted with %v when it is not a
	// string.
	CorrelationID string
}

func toRecord(offset int64, m *amqp.Message) Record {
	r := Record{Offset: offset, ApplicationProperties: m.ApplicationProperties}
	if p := m.Properties; p != nil {
		r.MessageID = idString(p.MessageID)
		r.Properties.CorrelationID = idString(p.CorrelationID)
		r.Properties.ContentType = p.ContentType
		r.Timestamp = p.CreationTime
	}
	switch len(m.Data) {
	case 0:
		switch v := m.Value.(type) {
		case []byte:
			r.Body = v
		case string:
			r.Body = []byte(v)
		}
	case 1:
		r.Body = m.Data[0]
	default:
		for _, d := range m.Data {
			r.Body = append(r.Body, d...)
		}
	}
	return r
}

func idString(id any) string {
	switch v := id.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// Messages turns records of stream into idem messages, each received at
// received.
func Messages(stream string, recs []Record, received time.Time) []idem.Message {
	msgs := make([]idem.Message, len(recs))
	for i, r := range recs {
		msgs[i] = idem.Message{
			MessageID: r.MessageID, Body: r.Body, Headers: r.ApplicationProperties,
			ContentType: r.Properties.ContentType, CorrelationID: r.Properties.CorrelationID,
			Source: stream, Offset: r.Offset, HasOffset: true, Timestamp: r.Timestamp, Attempt: 1,
			ReceivedAt: received,
		}
	}
	return msgs
}
