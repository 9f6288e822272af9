// Package ledger carries external side effects out of a consumer's
// transaction: a handler records an effect (an e-mail, a card capture, a
// message to publish) as a row in the same transaction as its business
// write, and a dispatcher carries it out after the commit, with an
// idempotency key that is stable across retries, replays and processes.
//
// A database transaction cannot take back a card capture, so the effect is
// recorded as intent, never performed inside the transaction. An attempt
// whose outcome cannot be known (a timeout after the request left, a crash
// while the call was in flight) becomes StatusUnknown and is never retried
// blindly: only an executor that declares its target deduplicates by
// idempotency key gets such effects retried automatically, with the same key.
//
// Record reads the replay mode from the context (idem.ModeFrom): during
// idem.Rebuild effects are written as StatusSuppressed and never dispatched;
// during idem.Forensic nothing is written and effects are captured in memory
// (see WithCapture).
//
// # Tracing
//
// Record keeps the trace context of its ctx (the W3C traceparent and
// tracestate of the active span) beside the effect. The dispatcher runs each
// attempt in a span named "dispatch <effect type>" ("lookup <effect type>"
// for a Reconciler's lookup) that is a child of that span, so an attempt
// shows up in the trace of the request or message that caused it, however
// much later and in whichever process it runs; an effect recorded outside
// any trace gets a root span. Under it HTTPExecutor starts an HTTP client
// span and AMQPExecutor a producer span, named and attributed after the
// OpenTelemetry semantic conventions, and each sends its span's context on:
// in the traceparent header of the request, or in the headers of the
// published message. W3C Trace Context is propagated even when the
// application sets no propagator; a global one it sets
// (otel.SetTextMapPropagator) is used instead. A custom Executor receives the
// dispatch span in its ctx and injects it with the propagator of its choice.
//
// The Dispatcher implements health.Reporter (ready while its database and
// notification listener work, live while its loops turn), and logs a
// warning, with the effect id, type, attempt and error, whenever an effect
// becomes unknown or failed_terminal: those wait for an operator
// (`idem ledger resolve`).
package ledger
