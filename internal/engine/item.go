package engine

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
)

// Item is one message as the engine runs it: the message itself — the
// handler gets it, and its ID, Hash, BusinessKey, Source and Offset are its
// identity in the inbox — with what travels beside it: how its source
// delivered it, and why it cannot be processed when it cannot.
type Item struct {
	*idem.Message
	// DeliveryTag is the AMQP delivery tag, for spans (0 for streams).
	DeliveryTag uint64
	// Suspect marks a delivery the broker made before (redelivered): it may
	// have killed its worker, so it runs alone (see RunAlone).
	Suspect bool
	// Returned marks a delivery back from the consumer's own retry queue,
	// or retried in place (Again): its failed attempts and original route
	// are in the attempts table.
	Returned bool
	// Key is its ordering key, set by a queue source with Queue.Ordered:
	// once it is to be retried, its key's later items in its batch are Held.
	Key string
	// Reject, when set, dead-letters the message without running the
	// handler.
	Reject *Reject

	// row is the item's attempts-table row, once read.
	row *attemptRow
	// postponed counts the batches the item left because another batch in
	// flight wrote its row (see writeKeys).
	postponed int
}

// Again readies it, whose attempt failed (Retried) or did not settle
// (Unresolved), for another attempt in its source's process, without the
// broker: like a delivery back from the retry queue, its next attempt reads
// its failed attempts in the attempts table. Its message becomes a copy: a
// handler of the failed attempt that was abandoned may still read the old
// one.
func (it *Item) Again() {
	m := *it.Message
	it.Message, it.Returned, it.row = &m, true, nil
}

// Reject says why a message cannot be processed.
type Reject struct {
	// Reason is the dead-letter reason.
	Reason string
	// Err is the cause.
	Err error
}

// Result is what became of one message, with what its source needs to act
// on it.
type Result struct {
	Outcome idem.Outcome
	// Reason is the dead-letter reason.
	Reason string
	// Err is the handler error or the dead-letter cause.
	Err error
	// StoredHash is the inbox's hash, for duplicates and conflicts.
	StoredHash idem.Hash
	// Inbox is what the inbox held before the message (0: not looked up).
	Inbox inbox.Decision
}

// unresolved returns n Unresolved results: nothing of the batch committed,
// not even the results decided for messages excluded from it (their
// dead-letter rows and attempt counts are written with the batch).
func unresolved(n int, err error) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = Result{Outcome: idem.Unresolved, Err: err}
	}
	return out
}

// Undecodable marks it, whose bytes the client library could not decode,
// to be dead-lettered as undecodable (cause says why) without running its
// handler. Nothing derived from its bytes stands: its row is found by
// "sha256:" and the hash of its bytes.
func (it *Item) Undecodable(cause error) {
	it.ID, it.BusinessKey, it.Hash = "", "", idem.HashBytes(it.Body)
	it.Reject = &Reject{Reason: deadletters.ReasonUndecodable, Err: cause}
}
