package deadletters

// Dead-letter reasons the runtime sets itself: the x-idem-reason header of
// the copy in the dead-letter queue and the reason column of its row.
// Handlers add their own with consumer.DeadLetter.
const (
	// ReasonPayloadConflict: the inbox holds the message id with another
	// payload hash.
	ReasonPayloadConflict = "payload_conflict"
	// ReasonMissingMessageID: the message has no id.
	ReasonMissingMessageID = "missing_message_id"
	// ReasonInvalidMessageID: the id is too long, or the consumer's
	// MessageID function failed for another reason than ReasonInvalidID
	// (consumer.IDFromJSONField: the body is not a JSON object that
	// idem.CanonicalJSON accepts).
	ReasonInvalidMessageID = "invalid_message_id"
	// ReasonInvalidID: the id has no one spelling, so it is refused rather
	// than repaired (idem.ErrInvalidID): it is not valid UTF-8 or holds a
	// NUL, whatever its source (message-id property, header, stream
	// message property, JSON field), or a JSON id field holds an unpaired
	// surrogate escape, a number idem.CanonicalJSON refuses, or a value
	// that is neither a string nor a number.
	ReasonInvalidID = "invalid_id"
	// ReasonDecodeError: the body could not be decoded (consumer.JSON,
	// canonical JSON hashing).
	ReasonDecodeError = "decode_error"
	// ReasonPermanent: the handler returned consumer.Permanent(err).
	ReasonPermanent = "permanent"
	// ReasonMaxAttempts: the handler failed on every attempt.
	ReasonMaxAttempts = "max_attempts"
	// ReasonTooLarge: the body is larger than MaxMessageBytes.
	ReasonTooLarge = "message_too_large"
	// ReasonTooManyHeaders: the message has more than MaxHeaders headers.
	ReasonTooManyHeaders = "too_many_headers"
	// ReasonInvalidKey: the consumer's BusinessKey function failed.
	ReasonInvalidKey = "invalid_business_key"
	// ReasonHandlerTimeout: the handler ran past HandlerTimeout on its last
	// attempt.
	ReasonHandlerTimeout = "handler_timeout"
	// ReasonHandlerEndedTx: the handler tried to commit, roll back or
	// otherwise end the batch transaction, which the runtime owns.
	ReasonHandlerEndedTx = "handler_ended_transaction"
	// ReasonWorkerCrashed: the worker process died each time the message
	// ran alone (a poison message), MaxCrashes times.
	ReasonWorkerCrashed = "worker_crashed"
	// ReasonUndecodable: the client library could not decode the message.
	// From a queue: the AMQP client would have refused its properties (a
	// header table nested too deep, too many entries, a field type it does
	// not know) and closed the connection; the properties it could not
	// read are not in the dead-letter copy, the body is. From a stream:
	// the record is not an AMQP 1.0 message the stream client can decode
	// (it errs, or panics, or the record is cut short); the row is found
	// by "sha256:" and the hash of the record's bytes, which are its
	// payload. Only the client sets this reason, never a header.
	ReasonUndecodable = "undecodable"
)
