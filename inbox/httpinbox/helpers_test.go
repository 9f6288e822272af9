package httpinbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// fixture is a fresh schema with a payments table, a Middleware on it, and a
// payments handler that counts its runs.
type fixture struct {
	t        *testing.T
	pool     *pgxpool.Pool
	tables   idem.Tables
	m        *httpinbox.Middleware
	payments string
	runs     atomic.Int64 // handler invocations, committed or not
}

// newFixture scopes keys by the X-Tenant-ID and X-Test-Caller headers
// (caller "test-client" when the request names none, since an anonymous
// request cannot own a key) unless cfg sets a Tenant or Caller of its own or
// SharedScope.
func newFixture(t *testing.T, cfg httpinbox.Config) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	f := &fixture{t: t, pool: pool, tables: tables, payments: pgx.Identifier{tables.Schema, "payments"}.Sanitize()}
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+f.payments+` (
		id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		key_id text   NOT NULL,
		amount bigint NOT NULL)`)
	require.NoError(t, err)
	cfg.Tables = tables
	if !cfg.SharedScope && cfg.Tenant == nil && cfg.Caller == nil {
		// Stand-ins for authentication: a real service takes both from the
		// verified credentials, never from headers the client sets.
		cfg.Tenant = func(r *http.Request) string { return r.Header.Get("X-Tenant-ID") }
		cfg.Caller = func(r *http.Request) string {
			if c := r.Header.Get("X-Test-Caller"); c != "" {
				return c
			}
			return "test-client"
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f.m, err = httpinbox.New(pool, cfg)
	require.NoError(t, err)
	return f
}

type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// pay is the application handler: amount <= 0 is a validation failure, an
// amount over 1000 is declined with a stored 402, anything else inserts a
// payment whose key is the claim's KeyID.
func (f *fixture) pay(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
	f.runs.Add(1)
	var req paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return httpinbox.Response{}, httpinbox.Invalid(fmt.Errorf("body: %w", err))
	}
	if req.Amount <= 0 {
		return httpinbox.Response{}, httpinbox.Invalid(errors.New("amount must be positive"))
	}
	if req.Amount > 1000 {
		return httpinbox.Problem(http.StatusPaymentRequired, "INSUFFICIENT_FUNDS", "declined"), nil
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+f.payments+` (key_id, amount) VALUES ($1, $2) RETURNING id`,
		httpinbox.FromContext(ctx).KeyID(), req.Amount).Scan(&id)
	if err != nil {
		return httpinbox.Response{}, err
	}
	resp, err := httpinbox.JSON(http.StatusCreated, map[string]any{"id": id, "amount": req.Amount, "currency": req.Currency})
	resp.ResourceID = fmt.Sprint(id)
	resp.Header.Set("Location", fmt.Sprintf("/payments/%d", id))
	return resp, err
}

// handler returns the payments route with the fixture's handler.
func (f *fixture) handler(route httpinbox.Route) http.Handler {
	if route.Operation == "" {
		route.Operation = "payments.create"
	}
	return f.m.Handle(route, f.pay)
}

// count returns the number of committed payments.
func (f *fixture) count() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.payments).Scan(&n))
	return n
}

// records returns the number of key records.
func (f *fixture) records() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.tables.Table("http_keys")).Scan(&n))
	return n
}

// state returns the state of the only record with key.
func (f *fixture) state(key string) string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.pool.QueryRow(context.Background(),
		`SELECT state FROM `+f.tables.Table("http_keys")+` WHERE idempotency_key = $1`, key).Scan(&s))
	return s
}

// post sends a POST with key (none when "") and body to h in process.
func post(h http.Handler, key, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(httpinbox.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// problemOf decodes a problem body and checks its media type.
func problemOf(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	return p
}

func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	p := problemOf(t, rec)
	require.Equal(t, code, p["code"])
	require.Equal(t, httpinbox.ProblemType(code), p["type"])
	require.EqualValues(t, status, p["status"])
}

// elapse moves the key records that match where (every record when "") d
// into the past, as if d had passed: their creation, lease, completion,
// expiry and tombstone.
func (f *fixture) elapse(d time.Duration, where string) {
	f.t.Helper()
	if where == "" {
		where = "true"
	}
	_, err := f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+` SET
		created_at = created_at - $1 * interval '1 microsecond',
		locked_until = locked_until - $1 * interval '1 microsecond',
		completed_at = completed_at - $1 * interval '1 microsecond',
		expires_at = expires_at - $1 * interval '1 microsecond',
		forget_at = forget_at - $1 * interval '1 microsecond'
	WHERE `+where, d.Microseconds())
	require.NoError(f.t, err)
}

// forgotten is how long after its first request a record of the default
// Config is forgotten: its expiry and its tombstone, and a minute.
const forgotten = httpinbox.DefaultExpiry + httpinbox.DefaultTombstone + time.Minute
