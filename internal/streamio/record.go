package streamio

import (
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/streamclient/amqp"
)

// Record is one record read from a stream: the idem message it becomes,
// with its MessageID (the AMQP 1.0 message-id, formatted with %v when it
// is not a string), Body (the data sections concatenated, or an amqp-value
// that is a string or []byte), Headers (the application properties),
// ContentType, CorrelationID, Offset (HasOffset), and Timestamp (the
// creation-time property Publish sets; the Go stream client drops the
// chunk timestamp, so there is nothing better) set. Messages completes it
// for a batch.
type Record struct {
	idem.Message
	// Undecodable, when set, says why the stream client could not decode
	// the record (see internal/streamclient): its Body is then the
	// record's bytes, as far as they could be read, and only its Offset
	// is set besides. Only the client sets it: nothing in a record's bytes
	// can.
	Undecodable error
}

func toRecord(offset int64, m *amqp.Message) Record {
	r := Record{Message: idem.Message{Offset: offset, HasOffset: true, Headers: m.ApplicationProperties}}
	if m.DecodeError != nil {
		r.Body, r.Undecodable = m.DecodeError.Record, m.DecodeError
		return r
	}
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
// its Source and ReceivedAt, first attempt. The caller marks the items of
// the records that are Undecodable.
func Messages(stream string, recs []Record, received time.Time) []idem.Message {
	msgs := make([]idem.Message, len(recs))
	for i := range recs {
		msgs[i] = recs[i].Message
		msgs[i].Source, msgs[i].ReceivedAt, msgs[i].Attempt = stream, received, 1
	}
	return msgs
}
