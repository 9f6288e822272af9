// Package httpinbox protects the HTTP edge the way package inbox protects a
// consumer: an Idempotency-Key middleware whose record commits in the same
// PostgreSQL transaction as the handler's business write, so one request
// intent has exactly one effect however often the client retries.
//
// # Using it
//
// New takes the pool and a Config that says whose keys are whose; Handle
// wraps a handler that gets the request's transaction and returns the
// response to store:
//
//	mux.Handle("POST /payments", m.Handle(httpinbox.Route{Operation: "payments.create"},
//		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
//			var req struct {
//				Amount int64 `json:"amount"`
//			}
//			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
//				return httpinbox.Response{}, httpinbox.Invalid(fmt.Errorf("amount must be a positive integer"))
//			}
//			// The payment's identity comes from the key, so a re-run after a
//			// crash creates the same payment, never a second one.
//			id := "pay_" + httpinbox.FromContext(ctx).KeyID()[:12]
//			if _, err := tx.Exec(ctx, "INSERT INTO "+payments+" (id, amount) VALUES ($1, $2)", id, req.Amount); err != nil {
//				return httpinbox.Response{}, err
//			}
//			resp, err := httpinbox.JSON(http.StatusCreated, map[string]any{"id": id, "amount": req.Amount})
//			resp.ResourceID = id
//			return resp, err
//		}))
//
// The guide docs/http.md lists every answer the middleware gives.
//
// # The record
//
// A request carries a key (header Idempotency-Key). The record for
// (tenant, caller, operation, key) holds a fingerprint of the request, a
// state (started, completed, failed_replayable or unknown), a lease, and the
// stored response. The middleware:
//
//  1. claims the key with INSERT … ON CONFLICT DO NOTHING as started, under a
//     lease, in a short statement of its own, so that a concurrent request with
//     the same key sees "in progress" at once instead of blocking;
//  2. runs the handler in a second transaction that first re-locks the record
//     row (SELECT … FOR UPDATE, guarded by the lease owner token), then lets the
//     handler write, then stores the response and the final state in that same
//     transaction, and commits;
//  3. only then writes the response to the client.
//
// Crash semantics follow from that order. If the process dies before the
// commit, nothing of the handler's transaction exists: the record is still
// started, its lease expires, and the next request with the key takes it over
// and runs the handler again. If the process dies after the commit, the record
// is completed and the retry receives the stored response. A stale started
// record therefore proves that the handler's transaction did not commit; the
// database, not the middleware's memory, decides.
//
// A key protects its request until its expiry (Config.Expiry). Then its
// record stays as a tombstone for Config.Tombstone (7 days by default):
// a request with the key is refused with 422 IDEMPOTENCY_KEY_EXPIRED and
// runs nothing, because the first request may have taken effect. Only
// after that is the key forgotten, and cleanup deletes the record.
//
// # Scope
//
// A key is never global: it belongs to the (tenant, caller) that sent it,
// and a request with another caller's key runs as that caller's own request.
// Config.Caller and Config.Tenant say who a request belongs to, and must be
// taken from authentication, never from a value the client picks. New
// refuses a Config with neither (ErrNoScope) unless Config.SharedScope says
// explicitly that every caller shares one key space, which is only right for
// a single-tenant internal service. A request whose tenant and caller are
// both empty (an anonymous request) is answered 401 CodeScopeRequired unless
// SharedScope is set: anonymous callers must not share one key space either.
//
// # Webhooks
//
// Webhook serves a provider's signed events with the same record and the
// same guarantees, keyed by (provider, tenant, event id): a Verifier
// (TimestampedHMAC for the "t=…,v1=…" scheme of Stripe-style providers,
// GitHub for X-Hub-Signature-256, BodyHMAC for an HMAC-SHA256 of the body)
// checks the signature in constant time, and a bad, missing or stale one is
// answered 401 before anything else is read: nothing is stored or run. Only
// then is the event id taken (EventIDField, EventIDHeader), and the handler
// runs once per event in the transaction that records it; redeliveries get
// the stored answer. Webhook.Expiry keeps event ids for the provider's retry
// horizon.
//
// # Bulk commands
//
// Bulk serves a request with many items: an Idempotency-Key for the
// operation and an "itemKey" per item, {"items":[…]} in, one result per
// item out (200, or 207 when some were rejected or failed). The operation,
// its items' records and their writes commit in one transaction, each item
// under a savepoint. The same operation key with the same body replays the
// same bytes; an item key accepted under another operation is answered
// already_accepted with its original result and never runs twice, so a new
// operation carrying only the refused items retries just those.
//
// # Long-running operations
//
// Accept records, in the handler's transaction, an operation that a worker
// carries out later, and answers 202 with Location and Retry-After;
// OperationStatus serves its status document, which moves accepted →
// running → succeeded | failed | unknown, survives restarts, and is shown
// only to the tenant and caller that accepted it. A worker moves it with
// Operations.Start and Operations.Finish, or the operation follows a ledger
// effect (Accepted.Follows) and moves with the effect's outcome.
//
// # Identity
//
// The handler's effect identity must come from the record, not from the
// request: FromContext(ctx).KeyID() is stable across retries, so an event or
// ledger effect recorded with it keeps one identity however often the key is
// replayed or re-run.
//
// # Tracing
//
// Every request runs in a server span named and attributed after the HTTP
// semantic conventions ("POST /payments", http.request.method, http.route,
// http.response.status_code, …) plus idem.http.operation, idem.http.key_id
// and idem.http.decision (run, replayed, conflict, in_progress, limited,
// rejected). It continues the trace of an incoming traceparent: W3C Trace
// Context is read even when the application sets no propagator. The
// handler's context carries the span, so a ledger effect it records, such as
// an outbox message, continues the request's trace when the dispatcher
// carries it out. The request duration is recorded as
// http.server.request.duration.
//
// # Operating it
//
// Four gauges are read from the tables whenever the metrics are collected:
// idem.http_keys.oldest_in_progress_age (the oldest started key under a
// live lease: a request still running, or one that crashed and still holds
// its lease), idem.http_keys.oldest_unknown_age (the oldest Unknown
// outcome, which waits for an operator), and likewise
// idem.http_operations.oldest_in_progress_age and
// idem.http_operations.oldest_unknown_age for the operations a worker moves.
// Keys lists (a page at a time: KeyFilter.After, KeyRecord.Cursor), shows
// and resolves key records without a Middleware, one (Resolve), several
// (ResolveMany) or every one a state selects (ResolveWhere), each with its
// own audit row; and
// Operations (List, History, Resolve, Stats) does the same for operations;
// the `idem http-keys` and `idem operations` commands are built on them.
package httpinbox
