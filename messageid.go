package idem

import (
	"fmt"

	"github.com/google/uuid"
)

// NewMessageID returns a new message id for a publisher: a UUID of version
// 7 (RFC 9562), whose first 48 bits are the time in milliseconds, so that
// ids published later sort later. A consumer's inbox keys its rows by
// (consumer, message id): time-ordered ids are inserted at the right edge
// of that index, into pages the cache holds and the write-ahead log has
// already imaged since the last checkpoint, where random ids (version 4)
// touch a random page of it per claim (see BENCHMARKS.md, "Message ids and
// the write-ahead log"). Ids made within one millisecond by one process
// still sort in the order they were made.
//
// Make the id once per message and keep it on every retry of the publish:
// a copy published again under a new id is a new message to the consumer.
func NewMessageID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// The randomness source failed: nothing can make an id then.
		panic(fmt.Sprintf("idem: new message id: %v", err))
	}
	return id.String()
}
