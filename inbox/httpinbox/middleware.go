package httpinbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tracing"
)

// Handler is an application handler behind the middleware. It gets the
// transaction that also holds the key's record: its writes, the stored
// response and any outbox or ledger entry commit together. Its Commit and
// Rollback return ErrTxOwned; tx.Begin opens a savepoint as usual. The
// request body is buffered and can be read from r as usual.
//
// What it returns decides the record:
//   - a Response with a status below 400: stored as completed and replayed;
//   - a Response with a 4xx status: an application failure (e.g. 402),
//     stored as failed_replayable and replayed;
//   - Unknown(resp): stored as unknown and replayed, never run again;
//   - a Response with a 5xx status: sent but not stored; the transaction
//     rolls back and the key is released, because a server error must stay
//     retryable;
//   - Invalid(err) or Reject(resp): sent but not stored; the transaction
//     rolls back and the key is deleted, so the client may fix the request
//     and retry with the same key;
//   - any other error: the transaction rolls back, the key is released and
//     the client receives a 500 problem; a retry with the key runs again.
//
// A panic is treated like a crash: the transaction rolls back, the record
// stays started until its lease expires, and the panic continues.
type Handler func(ctx context.Context, tx pgx.Tx, r *http.Request) (Response, error)

// Route describes one idempotent endpoint.
type Route struct {
	// Operation names what the route does, e.g. "payments.create". It is
	// part of the key's scope and of the fingerprint, and an attribute of
	// the metrics, so it must be a fixed name, not a value from the request.
	// Required.
	Operation string
	// Template is the route template in the fingerprint. Default: the
	// http.ServeMux pattern that matched the request (Request.Pattern).
	Template string
	// KeyOptional lets requests without an Idempotency-Key through: their
	// handler runs in a transaction, nothing is recorded, and FromContext
	// returns nil. Default: a key is required (400 MISSING_IDEMPOTENCY_KEY).
	KeyOptional bool
	// OmitBody keeps response bodies of this route out of the store, for
	// sensitive responses: the first caller receives the body, a replay
	// receives the stored status, headers and resource id with an empty body.
	OmitBody bool
	// Tombstone is Config.Tombstone for this route: how long after its
	// expiry a key is refused with 422 IDEMPOTENCY_KEY_EXPIRED, or
	// NoTombstone. Default: Config.Tombstone.
	Tombstone time.Duration
}

// Middleware turns handlers into idempotent http.Handlers backed by the
// http_keys table. It is safe for concurrent use.
type Middleware struct {
	pool    *pgxpool.Pool
	cfg     Config
	sql     statements
	stored  map[string]bool // canonical names of the stored headers
	metrics metrics
	tracer  trace.Tracer
	log     *slog.Logger
	ops     *Operations
}

// New returns a Middleware that keeps its records in pool, in the http_keys
// table of cfg.Tables (created by package migrate). It fails with ErrNoScope
// when cfg says neither how keys are scoped (Caller, Tenant) nor that they
// are shared (SharedScope), and with ErrConfig for other invalid settings
// and a nil pool.
func New(pool *pgxpool.Pool, cfg Config) (*Middleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("%w: no pool", ErrConfig)
	}
	cfg = cfg.scoped()
	met, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	ages := newKeySQL(cfg.Tables).ages
	if err := met.observeAges(func(ctx context.Context) (time.Duration, time.Duration, error) {
		return keyAges(ctx, pool, ages)
	}); err != nil {
		return nil, err
	}
	ops, err := NewOperations(pool, cfg.Tables)
	if err != nil {
		return nil, err
	}
	if err := met.observeOperationAges(ops.ages); err != nil {
		return nil, err
	}
	m := &Middleware{
		ops:     ops,
		pool:    pool,
		cfg:     cfg,
		sql:     newStatements(cfg.Tables),
		stored:  make(map[string]bool, len(cfg.StoredHeaders)),
		metrics: met,
		tracer:  cfg.TracerProvider.Tracer(instrumentation, trace.WithSchemaURL(tracing.SchemaURL)),
		log:     cfg.Logger,
	}
	for _, h := range cfg.StoredHeaders {
		m.stored[http.CanonicalHeaderKey(h)] = true
	}
	return m, nil
}

// Handle returns an http.Handler that runs h idempotently for route. Like
// http.ServeMux.Handle, it panics on a programming error: an empty or
// invalid Operation, a nil h, or a negative Tombstone other than
// NoTombstone.
func (m *Middleware) Handle(route Route, h Handler) http.Handler {
	if route.Operation == "" || !utf8.ValidString(route.Operation) || h == nil ||
		(route.Tombstone != 0 && !validTombstone(route.Tombstone)) {
		panic(fmt.Sprintf("httpinbox: Handle needs a valid Operation, a handler and a valid Tombstone, got %q and %s",
			route.Operation, route.Tombstone))
	}
	return &endpoint{m: m, route: route, h: h, expiry: m.cfg.Expiry, tombstone: tombstoneOf(route.Tombstone, m.cfg.Tombstone)}
}

// endpoint is one route behind the middleware: an Idempotency-Key route, a
// webhook (webhook set) whose key is the verified event id, or the status of
// operations (status set).
type endpoint struct {
	m         *Middleware
	route     Route
	h         Handler
	expiry    time.Duration // of the route's records
	tombstone time.Duration // how long past expiry they are refused; 0: not at all
	webhook   *Webhook
	status    bool
}

// detachedTimeout bounds the work that runs after the request context may be
// gone: commit, rollback, release.
const detachedTimeout = 10 * time.Second

// ServeHTTP runs the request in a server span (see startSpan) and serves it.
func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x, w, r := e.startSpan(w, r)
	defer e.end(r.Context(), x)
	e.serve(w, r)
}

// serve decides what to do with the request's key and does it.
func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case e.webhook != nil:
		e.serveWebhook(w, r)
		return
	case e.status:
		e.serveStatus(w, r)
		return
	}
	m := e.m
	key, err := parseKey(r.Header, m.cfg.MaxKeyLength)
	switch {
	case errors.Is(err, errNoKey) && e.route.KeyOptional:
		if body, ok := e.readBody(w, r); ok {
			r.Body = io.NopCloser(bytes.NewReader(body))
			decide(r.Context(), "run", nil)
			e.execute(w, r, nil)
		}
		return
	case errors.Is(err, errNoKey):
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusBadRequest, CodeMissingKey, "this operation requires an Idempotency-Key header", 0)
		return
	case err != nil:
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusBadRequest, CodeInvalidKey, err.Error(), 0)
		return
	}
	tenant, caller, ok := e.scope(w, r)
	if !ok {
		return
	}
	body, ok := e.readBody(w, r)
	if !ok {
		return
	}
	e.claimAndAnswer(w, r, tenant, caller, key, body)
}

// claimAndAnswer runs the request with body (already read) under the key of
// (tenant, caller, the route's operation, key).
func (e *endpoint) claimAndAnswer(w http.ResponseWriter, r *http.Request, tenant, caller, key string, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	c := &Claim{
		id:        scopeID(tenant, caller, e.route.Operation, key),
		tenant:    tenant,
		caller:    caller,
		operation: e.route.Operation,
		key:       key,
		expiry:    e.expiry,
		tombstone: e.tombstone,
	}
	_, _ = rand.Read(c.owner[:]) // crypto/rand.Read never fails
	template := e.route.Template
	if template == "" {
		template = r.Pattern
	}
	e.answer(w, r, c, fingerprint(r, template, tenant, caller, e.route.Operation, body))
}

// scope returns the tenant and caller of r, or answers and returns false
// when they cannot own a key: invalid text, or both empty (an anonymous
// request) unless the Config shares one key space on purpose.
func (e *endpoint) scope(w http.ResponseWriter, r *http.Request) (tenant, caller string, ok bool) {
	m := e.m
	tenant, caller = m.cfg.Tenant(r), m.cfg.Caller(r)
	switch {
	case !validScope(tenant) || !validScope(caller):
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusBadRequest, CodeInvalidScope,
			"tenant and caller must be valid UTF-8 without NUL, at most 255 bytes", 0)
		return "", "", false
	case tenant == "" && caller == "" && !m.cfg.SharedScope:
		decide(r.Context(), "rejected", nil)
		writeProblem(w, http.StatusUnauthorized, CodeScopeRequired,
			"an Idempotency-Key belongs to an authenticated tenant or caller; this request has neither", 0)
		return "", "", false
	}
	return tenant, caller, true
}

// answer claims c for the request with fingerprint fp and answers: it runs
// the handler, replays the stored response, or refuses, waiting up to
// Config.Wait for a key in progress.
func (e *endpoint) answer(w http.ResponseWriter, r *http.Request, c *Claim, fp idem.Hash) {
	m := e.m
	ctx := r.Context()
	var deadline time.Time
	if m.cfg.Wait > 0 {
		deadline = time.Now().Add(m.cfg.Wait)
	}
	pause := 5 * time.Millisecond
	for {
		out, rec, err := m.claim(ctx, c, fp)
		if err != nil {
			m.log.Error("httpinbox: claim failed", "operation", c.operation, "key_id", c.id.Short(), "error", err)
			writeProblem(w, http.StatusInternalServerError, CodeInternal, "the idempotency store failed", 0)
			return
		}
		if out != outcomeInProgress || time.Until(deadline) <= 0 {
			decide(ctx, out.String(), c)
		}
		switch out {
		case outcomeRun:
			m.metrics.started.Add(ctx, 1, m.metrics.opt(c.operation))
			e.execute(w, r, c)
		case outcomeReplay:
			m.metrics.replayed.Add(ctx, 1, m.metrics.opt(c.operation))
			writeResponse(w, rec.status, rec.header, rec.resourceID, rec.body, true)
		case outcomeConflict:
			m.metrics.conflict.Add(ctx, 1, m.metrics.opt(c.operation))
			m.log.Warn("httpinbox: key reused with a different request",
				"operation", c.operation, "key_id", c.id.Short(), "fingerprint", fp.Short())
			writeProblem(w, http.StatusUnprocessableEntity, CodeKeyReused,
				"this Idempotency-Key was used with a different request", 0)
		case outcomeLimited:
			writeProblem(w, http.StatusTooManyRequests, CodeTooManyKeys,
				fmt.Sprintf("at most %d new idempotency keys per minute", m.cfg.NewKeysPerMinute), 60)
		case outcomeExpired:
			m.metrics.expiredRefused.Add(ctx, 1, m.metrics.opt(c.operation))
			writeProblem(w, http.StatusUnprocessableEntity, CodeKeyExpired, fmt.Sprintf(
				"this Idempotency-Key expired at %s and its request may have taken effect; send a new request with a new key",
				rec.expiresAt.UTC().Format(time.RFC3339)), 0)
		case outcomeInProgress:
			if wait := time.Until(deadline); wait > 0 {
				t := time.NewTimer(min(pause, wait))
				select {
				case <-ctx.Done():
					t.Stop()
					return // the client is gone; nobody reads an answer
				case <-t.C:
				}
				pause = min(2*pause, 100*time.Millisecond)
				continue
			}
			m.metrics.inProgress.Add(ctx, 1, m.metrics.opt(c.operation))
			writeProblem(w, http.StatusConflict, CodeInProgress,
				"a request with this Idempotency-Key is in progress", retryAfter(m.cfg.RetryAfter))
		}
		return
	}
}

func retryAfter(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }

// readBody reads the whole request body, bounded by MaxRequestBytes.
func (e *endpoint) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := e.m.cfg.MaxRequestBytes
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		writeProblem(w, http.StatusBadRequest, CodeValidationFailed, "cannot read the request body", 0)
		return nil, false
	case int64(len(body)) > limit:
		writeProblem(w, http.StatusRequestEntityTooLarge, CodeRequestTooLarge,
			fmt.Sprintf("the request body exceeds %d bytes", limit), 0)
		return nil, false
	}
	return body, true
}
