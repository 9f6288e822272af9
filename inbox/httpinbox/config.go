package httpinbox

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/configerr"
)

// Defaults of Config.
const (
	DefaultExpiry             = 24 * time.Hour
	DefaultLease              = 30 * time.Second
	DefaultMaxKeyLength       = 255
	DefaultMaxRequestBytes    = 1 << 20
	DefaultMaxStoredBodyBytes = 64 << 10
	DefaultRetryAfter         = time.Second
	DefaultTombstone          = 7 * 24 * time.Hour
)

// NoTombstone, as Config.Tombstone, Route.Tombstone or Webhook.Tombstone,
// forgets a key at its expiry: a request that comes later with it runs as
// a new request.
const NoTombstone time.Duration = -1

// maxScopeLength bounds tenant and caller values, which may come from
// headers.
const maxScopeLength = 255

// defaultStoredHeaders are the response headers stored and replayed when
// Config.StoredHeaders is nil.
var defaultStoredHeaders = [...]string{"Content-Type", "Content-Language", "ETag", "Last-Modified", "Link", "Location", "Retry-After"}

// DefaultStoredHeaders returns the response headers stored and replayed
// when Config.StoredHeaders is nil, in a new slice the caller may change
// (to add a header to the defaults, append to it).
func DefaultStoredHeaders() []string { return slices.Clone(defaultStoredHeaders[:]) }

// ErrConfig is returned (wrapped) by New for an unusable Config. It matches
// idem.ErrConfig.
var ErrConfig = configerr.New("httpinbox: invalid config")

// ErrNoScope is returned by New for a Config without a Caller or Tenant
// function and without SharedScope: such a middleware would put every
// caller's keys in one space, and a caller who reuses another's key would
// receive that caller's stored response. It matches ErrConfig too.
var ErrNoScope = fmt.Errorf("%w: no Caller or Tenant function scopes the keys (set one, or SharedScope for a single-tenant internal service)", ErrConfig)

// Config configures a Middleware. A Config must say whose keys are whose:
// set Caller or Tenant (or both), or SharedScope. Every other field states
// its default.
type Config struct {
	// Caller returns the caller a request belongs to; keys are scoped per
	// caller. In production it MUST come from authentication (the verified
	// token's subject, the API key's owner), never from a value the client
	// chooses freely: a caller that can name another caller can read that
	// caller's stored responses by guessing keys. Values must be valid UTF-8
	// without NUL, at most 255 bytes. Default: none; see SharedScope.
	Caller func(*http.Request) string
	// Expiry is how long a key protects its request after the first one:
	// until then a retry receives the stored response. It must exceed the
	// longest horizon over which clients retry (see docs/http.md). What a
	// request that comes later gets is Tombstone's. A key whose outcome is
	// unknown is kept past it, until an operator resolves it. Default: 24h.
	Expiry time.Duration
	// Lease is how long a started request owns its key before another
	// request with the key may take it over. A running handler keeps the
	// record row locked, so a slow handler is never taken over; the lease only
	// decides how soon a crashed request's key runs again. Default: 30s.
	Lease time.Duration
	// Logger receives warnings (conflicts, released keys, unknown outcomes).
	// Keys are logged only as a short hash of their id. Default:
	// slog.Default().
	Logger *slog.Logger
	// MaxKeyLength is the longest Idempotency-Key accepted, in bytes.
	// Default: 255.
	MaxKeyLength int
	// MaxRequestBytes is the largest request body read; a larger one is
	// answered 413. Default: 1 MiB.
	MaxRequestBytes int64
	// MaxStoredBodyBytes is the largest response body stored. A larger body
	// is sent to the first caller but stored without its body, like a route
	// with OmitBody. Default: 64 KiB.
	MaxStoredBodyBytes int
	// MeterProvider provides the counters and the request duration
	// histogram (http.server.request.duration). Default: the global
	// provider.
	MeterProvider metric.MeterProvider
	// NewKeysPerMinute limits how many new keys one (tenant, caller) may
	// create in a minute; a request over the limit is answered 429. Requests
	// with existing keys (replays, in progress) are not limited. The count
	// is read in the claim statement and may be exceeded slightly under
	// concurrency. Default: 0, no limit.
	NewKeysPerMinute int
	// RetryAfter is the Retry-After sent with a 409 "in progress". Default: 1s.
	RetryAfter time.Duration
	// SharedScope puts every caller's keys in one key space: a request with
	// another caller's key receives that caller's stored response. Only for
	// a single-tenant internal service whose callers all trust each other.
	// It must be set explicitly when Caller and Tenant are both nil (New
	// fails with ErrNoScope otherwise), and cannot be combined with them.
	// Default: false.
	SharedScope bool
	// StoredHeaders lists the response headers stored with a response and
	// sent again on replay; others reach the first caller only. Default:
	// DefaultStoredHeaders().
	StoredHeaders []string
	// Tables says where the http_keys table lives. Default: idem's defaults.
	Tables idem.Tables
	// Tombstone is how long a key is remembered after its Expiry: a request
	// that comes with it in that time is refused with 422
	// IDEMPOTENCY_KEY_EXPIRED, and its handler does not run, because the
	// stored outcome may already have taken effect. Once the tombstone has
	// passed, a request with the key runs as a new request, and cleanup
	// deletes the record. A key whose request never committed (started) is
	// not refused: it runs. The record is kept whole meanwhile, so the
	// table holds Expiry + Tombstone of keys. NoTombstone (-1) forgets a
	// key at its expiry. Route.Tombstone and Webhook.Tombstone override it
	// per endpoint. Default: DefaultTombstone, 7 days.
	Tombstone time.Duration
	// Tenant returns the tenant a request belongs to; keys are scoped per
	// tenant. Like Caller it MUST come from authentication, not from a value
	// the client chooses freely. Values must be valid UTF-8 without NUL, at
	// most 255 bytes. Default: none; see SharedScope.
	Tenant func(*http.Request) string
	// TracerProvider provides the tracer of the server spans: every request
	// runs in a span that follows the HTTP semantic conventions and
	// continues the trace of an incoming traceparent. The handler's context
	// carries it, so a ledger effect or outbox message it records continues
	// the trace too. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Wait bounds how long a request whose key is in progress waits for the
	// first request to finish (and then receives its response) before it is
	// answered 409. Default: 0, answer 409 at once.
	Wait time.Duration
}

// noScope is the Caller or Tenant of a request when the Config has none.
func noScope(*http.Request) string { return "" }

func (c Config) withDefaults() Config {
	if c.Expiry == 0 {
		c.Expiry = DefaultExpiry
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = DefaultMaxKeyLength
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxStoredBodyBytes == 0 {
		c.MaxStoredBodyBytes = DefaultMaxStoredBodyBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Tombstone == 0 {
		c.Tombstone = DefaultTombstone
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = DefaultStoredHeaders()
	}
	c.Tables = c.Tables.WithDefaults()
	return c
}

// scoped returns c with "" for the scope functions it does not set, after
// validate has checked that this is what c asks for.
func (c Config) scoped() Config {
	if c.Caller == nil {
		c.Caller = noScope
	}
	if c.Tenant == nil {
		c.Tenant = noScope
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Caller == nil && c.Tenant == nil && !c.SharedScope:
		return ErrNoScope
	case c.SharedScope && (c.Caller != nil || c.Tenant != nil):
		return fmt.Errorf("%w: SharedScope cannot be combined with a Caller or Tenant function", ErrConfig)
	case c.Expiry < 0, c.Lease < 0, c.MaxKeyLength < 0, c.MaxRequestBytes < 0,
		c.MaxStoredBodyBytes < 0, c.NewKeysPerMinute < 0, c.RetryAfter < 0, c.Wait < 0:
		return fmt.Errorf("%w: negative duration or limit", ErrConfig)
	case !validTombstone(c.Tombstone):
		return fmt.Errorf("%w: tombstone %s: want a positive duration, or NoTombstone (-1)", ErrConfig, c.Tombstone)
	case c.Lease < time.Millisecond:
		return fmt.Errorf("%w: lease %s is shorter than 1ms", ErrConfig, c.Lease)
	case c.Expiry <= c.Lease:
		return fmt.Errorf("%w: expiry %s must exceed the lease %s", ErrConfig, c.Expiry, c.Lease)
	}
	if err := c.Tables.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// validTombstone reports whether d can be a record's tombstone: a positive
// duration, or NoTombstone.
func validTombstone(d time.Duration) bool { return d > 0 || d == NoTombstone }

// tombstoneOf is the tombstone of an endpoint whose own setting is d (0 for
// the Config's, def), as a duration to add to the expiry: 0 when off.
func tombstoneOf(d, def time.Duration) time.Duration {
	if d == 0 {
		d = def
	}
	return max(d, 0)
}
