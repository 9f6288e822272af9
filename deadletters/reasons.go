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
	// ReasonInvalidMessageID: the id is too long, not UTF-8 text, or the
	// consumer's MessageID function failed.
	ReasonInvalidMessageID = "invalid_message_id"
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
)
