package streamio

import (
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
)

// Record is one message read from a stream, as the idem message it
// becomes: its MessageID (the AMQP 1.0 message-id, formatted with %v when
// it is not a string), Body (the data sections concatenated, or an
// amqp-value that is a string or []byte), Headers (the application
// properties), ContentType, CorrelationID, Offset (HasOffset), and
// Timestamp (the creation-time property Publish sets; the Go stream client
// drops the chunk timestamp, so there is nothing better) are set. Messages
// completes it for a batch.
type Record = idem.Message

func toRecord(offset int64, m *amqp.Message) Record {
	r := Record{Offset: offset, HasOffset: true, Headers: m.ApplicationProperties}
	if p := m.Properties; p != nil {
		r.MessageID = idString(p.MessageID)
		r.CorrelationID = idString(p.CorrelationID)
		r.ContentType = p.ContentType
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

// Messages returns the records of stream, received at received, as the
// messages of a batch: a copy (the reader reuses its buffers), each with
// its Source and ReceivedAt, first attempt.
func Messages(stream string, recs []Record, received time.Time) []idem.Message {
	msgs := slices.Clone(recs)
	for i := range msgs {
		msgs[i].Source, msgs[i].ReceivedAt, msgs[i].Attempt = stream, received, 1
	}
	return msgs
}
