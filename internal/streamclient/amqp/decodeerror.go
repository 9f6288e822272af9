package amqp

// This file is idem's patch (see ../doc.go).

import "fmt"

// DecodeError says why a stream record could not be decoded as an AMQP 1.0
// message: the decoder returned an error, or panicked (a map or a list as
// an annotation key is unhashable in Go), or the record or the sub-entry
// batch holding it was cut short or could not be uncompressed.
type DecodeError struct {
	// Record is the record's bytes as far as they could be read; nil when
	// the sub-entry batch holding it could not be uncompressed.
	Record []byte
	// Err is the cause.
	Err error
}

// Error describes the failure.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("record of %d bytes: %v", len(e.Record), e.Err)
}

// Unwrap returns the cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// Decode decodes record as a stream message. It never panics: a record
// it cannot decode becomes a Message holding only its DecodeError.
func Decode(record []byte) (m *Message) {
	defer func() {
		if p := recover(); p != nil {
			m = &Message{DecodeError: &DecodeError{Record: record, Err: fmt.Errorf("the decoder panicked: %v", p)}}
		}
	}()
	m = &Message{}
	if err := m.UnmarshalBinary(record); err != nil {
		return &Message{DecodeError: &DecodeError{Record: record, Err: err}}
	}
	return m
}
