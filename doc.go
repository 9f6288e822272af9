// Package idem holds the vocabulary that idem's packages share: the message
// and what became of it (Message, Outcome), the errors a handler returns or
// meets, the error every configuration error matches (ErrConfig), payload
// hashes and canonical JSON, the names of the tables idem owns, the replay
// mode carried in a context, and the deferred writes of a batch.
//
// idem consumes RabbitMQ messages effectively once. Most programs start in
// package consumer (the runtime) and meet this package through its types:
// Message in every handler (consumer.Message is the same type), Outcome in
// every result, Hash in the inbox, Tables in every Config, Mode in a handler
// that must behave differently during a replay.
//
// # Messages, outcomes and errors
//
// Every source (a queue, a stream, a replay, consumer.Process) builds one
// Message per delivery; the runtime derives its ID, Hash and BusinessKey in
// place, and the handler receives that same value. What became of it is an
// Outcome: Processed, Duplicate, DeadLettered, Retried or Unresolved from
// any source; Postponed (a queue's message that left its batch for a later
// one), Held (a message of a stream, a replay or a queue's key waiting
// behind one retried in place) and Skipped (not selected by a repair replay) where they apply.
// Outcome.String is the word the metrics, spans and logs use (the metric
// idem.consumer.messages counts a payload conflict as conflict).
//
// A handler that returns a *DeadLetterError (consumer.Permanent,
// consumer.DeadLetter) has its message dead-lettered with the error's
// Reason; any other error is retried. A recovered panic becomes a
// *PanicError, a handler past its deadline meets a *TimeoutError, and a
// handler that tries to end the runtime's transaction gets
// ErrTransactionControl.
//
// A configuration that a package cannot use (a Config, options or
// arguments) is refused with an error that matches ErrConfig, whichever
// package refused it: one errors.Is tells "fix the configuration" from "try
// again".
//
// # Payload hashes
//
// The inbox stores the SHA-256 of each message's payload beside its id, so a
// second delivery with the same id is told apart from a different payload
// that reuses the id. HashBytes hashes the raw body; it is exact and cheap,
// and a publisher that resends a message resends the same bytes. HashJSON
// hashes CanonicalJSON of the body instead, for publishers that may
// re-serialise the same document differently:
//
//	a, _ := idem.HashJSON([]byte(`{"order": "o-1", "amount": 12.50}`))
//	b, _ := idem.HashJSON([]byte(`{"amount":1.25e1,"order":"o-1"}`))
//	c, _ := idem.CanonicalJSON([]byte(`{"order": "o-1", "amount": 12.50}`))
//	fmt.Println(a == b)
//	fmt.Println(string(c))
//
// CanonicalJSON is idem's own canonical form, close to RFC 8785 (JCS) but not
// the same: object keys are ordered by Unicode code point (RFC 8785 orders
// them by UTF-16 code unit, which differs for characters outside the Basic
// Multilingual Plane), and numbers keep their exact decimal value (RFC 8785
// rounds them through IEEE 754 doubles, so two large integers may collide).
// Do not compare its output with another JCS implementation's. Pick one hash
// per consumer and keep it: changing it turns every redelivery of an old
// message into a conflict.
//
// An id read from a JSON body (consumer.IDFromJSONField) follows the same
// rules: a number is spelled as CanonicalJSON writes it, so 1000, 1000.0
// and 1e3 are one id, and an id that is not valid UTF-8 text without NUL,
// from any source, is refused with ErrInvalidID, never repaired into
// another. What CanonicalJSON refuses is an error wrapping ErrInvalidJSON.
//
// # Tables
//
// Every table idem owns lives in Tables.Schema, named Tables.Prefix + its
// name, and is always quoted as an identifier, so any schema or prefix is
// safe to configure. The zero value means schema "public", prefix "idem_":
//
//	billing := idem.Tables{Schema: "billing"}
//	fmt.Println(billing.Table("inbox"))
//
// Pass the same Tables to migrate.Up and to every Config of the packages that
// read or write those tables.
//
// # Replay modes
//
// A replay (package replay) runs the consumer's handler again with a Mode in
// its context: Normal, Rebuild, Forensic or Repair; live consumption is Live.
// ModeFrom reads it. Package ledger reads it to suppress effects during a
// rebuild and to write nothing during a forensic replay; a handler reads it
// when it must, for instance to report instead of write in forensic mode:
//
//	if idem.ModeFrom(ctx) == idem.Forensic {
//		return nil // report, do not write: the transaction is READ ONLY
//	}
//
// # Deferred writes
//
// Deferred collects writes that the owner of a transaction runs once, just
// before it commits. The consumer runtime puts one in a handler's context
// while it runs a batch without savepoints; consumer.Defer and ledger.Record
// use it, so that a batch's small writes travel in one round trip. Handlers
// use consumer.Defer rather than this type.
package idem
