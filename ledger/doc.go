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
// The Dispatcher implements health.Reporter (ready while its database and
// notification listener work, live while its loops turn), and logs a
// warning, with the effect id, type, attempt and error, whenever an effect
// becomes unknown or failed_terminal: those wait for an operator
// (`idem ledger resolve`).
package ledger
