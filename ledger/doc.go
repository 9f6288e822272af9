// Package ledger carries external side effects out of a consumer's
// transaction: a handler records an effect (an e-mail, a card capture, a
// message to publish) as a row in the same transaction as its business
// write, and a dispatcher carries it out after the commit, with an
// idempotency key that is stable across retries, replays and processes.
//
// A database transaction cannot take back a card capture, so the effect is
// recorded as intent, never performed inside the transaction. If the
// transaction rolls back, the effect never existed; if it commits, the
// effect will be attempted, with the same idempotency key on every attempt.
//
// # Recording an effect
//
// New returns a Ledger; Record writes an effect in the caller's transaction
// (inside a consumer handler, the batch's):
//
//	entry, err = l.Record(ctx, tx, ledger.Effect{
//		Type:        "mail.order-confirmation",
//		BusinessKey: "order-1042",
//		Target:      provider.URL,
//		Request:     map[string]string{"to": "ada@example.com"},
//	})
//
// The effect id is derived from Type and BusinessKey (EffectID) unless
// Effect.ID sets it; the idempotency key is derived from the id
// (IdempotencyKey). Recording the same id again with the same request returns
// the existing entry; with another request it fails with an
// *EffectConflictError and the transaction stays usable. Inside a consumer
// batch Record is deferred: the batch's effects are written with one
// statement just before the commit.
//
// # The dispatcher
//
// A Dispatcher claims due effects in batches (FOR UPDATE SKIP LOCKED, under
// a lease with an owner token), calls their executors outside any
// transaction, and writes each outcome with an UPDATE guarded by status and
// owner, so a dispatcher whose lease expired cannot overwrite a newer claim.
// Any number may run, in any processes. It wakes on LISTEN/NOTIFY when an
// effect commits and polls as a backup:
//
//	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{
//		Pool:      pool,
//		Tables:    tables,
//		Executors: map[string]ledger.Executor{"mail.order-confirmation": &ledger.HTTPExecutor{}},
//		Logger:    slog.New(slog.DiscardHandler),
//	})
//
// Run it until shutdown (go d.Run(ctx)): then it stops claiming, waits for
// the calls in flight and writes their outcomes.
//
// # Executors
//
// An Executor says what happened to a call: succeeded, failed_retryable
// (retried with backoff, up to DispatcherConfig.MaxAttempts), failed_terminal,
// or unknown. HTTPExecutor sends the request as JSON with an Idempotency-Key
// header and classifies the answer by status code. AMQPExecutor is the
// transactional outbox: it publishes a Publishing with publisher confirms and
// the effect id as message id:
//
//	_, err := l.Record(ctx, tx, ledger.Effect{
//		Type:        "order.confirmed",
//		BusinessKey: "order-1042",
//		Request: ledger.Publishing{
//			RoutingKey: queue,
//			Body:       []byte(`{"order":"order-1042"}`),
//		},
//	})
//
// # Unknown outcomes
//
// An attempt whose outcome cannot be known (a timeout after the request
// left, a crash while the call was in flight, a lease that expired) becomes
// StatusUnknown and is never retried blindly. Only an executor that declares
// its target deduplicates by idempotency key (DeduplicatesByKey) gets such
// effects sent again automatically, with the same key. An executor that can
// ask its target what became of a request implements Reconciler, and the
// dispatcher looks unknown effects up on a schedule. The others wait for an
// operator: List (a page at a time: Filter.After, Entry.Cursor), Get and
// History show them, and Resolve settles one (`idem ledger resolve`), with
// an audit row. ResolveMany settles several and ResolveWhere every one a
// Filter with a status selects, each in a transaction and an audit row of
// its own, refusing one that moved on since it was listed
// (Resolution.From): one decision after an outage, for all the effects it
// left unknown.
//
// # Replays
//
// Record reads the replay mode from the context (idem.ModeFrom): during
// idem.Rebuild effects are written as StatusSuppressed and never dispatched;
// during idem.Forensic nothing is written and effects are captured in memory
// (see WithCapture).
//
// # The ledger's horizon
//
// Retention deletes settled effects (DeleteSettled, which the retention
// package and `idem cleanup` call) and leaves, in the same statement, a
// tombstone for each: the effect id, its idempotency key, how and when it
// settled, when it was deleted (see Tombstone). Record probes the
// tombstones in the statement that inserts an effect, and writes an effect
// recorded again under a tombstoned id as StatusSuppressed: a repair, a
// rebuild or a redrive after retention never sends it twice. Suppressed
// effects are counted by idem.ledger.effects.suppressed, by effect type and
// reason ("tombstone" or "rebuild"). Tombstones go only with
// DeleteTombstones.
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
// # Health
//
// The Dispatcher implements health.Reporter (ready while its database and
// notification listener work, live while its loops turn), and logs a
// warning, with the effect id, type, attempt and error, whenever an effect
// becomes unknown or failed_terminal: those wait for an operator
// (`idem ledger resolve`).
package ledger
