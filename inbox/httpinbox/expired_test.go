package httpinbox_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// A retry that comes just after its key expired may be the retry of a
// request that took effect: it is refused from the record's tombstone, and
// the handler does not run, until the tombstone has passed; from then on the
// key is a new request.
func TestRetryJustAfterExpiryIsRefusedFromItsTombstoneAndRunsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	ctx := context.Background()
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 5}`).Code)
	rec, err := f.keys().Get(ctx, httpinbox.KeyID("", "test-client", "payments.create", "k1"))
	require.NoError(t, err)
	require.WithinDuration(t, rec.CreatedAt.Add(httpinbox.DefaultExpiry), rec.ExpiresAt, time.Second)
	require.WithinDuration(t, rec.ExpiresAt.Add(httpinbox.DefaultTombstone), rec.ForgetAt, time.Second)

	f.elapse(httpinbox.DefaultExpiry+time.Second, "")
	for _, body := range []string{`{"amount": 5}`, `{"amount": 6}`} {
		refused := post(h, "k1", body)
		requireProblem(t, refused, http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
		require.Empty(t, refused.Header().Get(httpinbox.HeaderReplayed), "the stored response no longer answers")
	}
	require.EqualValues(t, 1, f.runs.Load(), "the handler did not run again")
	require.Equal(t, 1, f.count())

	n, err := f.m.Cleanup(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "cleanup keeps the tombstone")
	requireProblem(t, post(h, "k1", `{"amount": 5}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)

	// Just before the tombstone ends it still refuses; after, the key is
	// forgotten: a request with it is new, even before cleanup ran.
	f.elapse(httpinbox.DefaultTombstone-time.Minute, "")
	requireProblem(t, post(h, "k1", `{"amount": 5}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	f.elapse(2*time.Minute, "")
	again := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusCreated, again.Code, again.Body.String())
	require.Empty(t, again.Header().Get(httpinbox.HeaderReplayed))
	require.EqualValues(t, 2, f.runs.Load())
	require.Equal(t, 2, f.count())
	require.Equal(t, 1, f.records())
}

// Keys are scoped per caller (invariant 14), and so is the tombstone: one
// caller's expired key refuses that caller only.
func TestExpiredKeyTombstoneIsScopedPerTenantAndCaller(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 5}`, "X-Tenant-ID", "acme", "X-Test-Caller", "alice").Code)
	f.elapse(httpinbox.DefaultExpiry+time.Second, "")

	requireProblem(t, post(h, "k1", `{"amount": 5}`, "X-Tenant-ID", "acme", "X-Test-Caller", "alice"),
		http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	for _, scope := range [][]string{
		{"X-Tenant-ID", "acme", "X-Test-Caller", "bob"},     // another caller
		{"X-Tenant-ID", "globex", "X-Test-Caller", "alice"}, // the same caller name in another tenant
	} {
		rec := post(h, "k1", `{"amount": 5}`, scope...)
		require.Equal(t, http.StatusCreated, rec.Code, "%v: %s", scope, rec.Body.String())
		require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed))
	}
	require.EqualValues(t, 3, f.runs.Load())
	requireProblem(t, post(h, "k1", `{"amount": 5}`, "X-Tenant-ID", "acme", "X-Test-Caller", "alice"),
		http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	require.EqualValues(t, 3, f.runs.Load())
}

// The setting is per route: a route may turn tombstones off (a key runs as
// new right after its expiry, as without tombstones) or keep them for its
// own time.
func TestRouteTombstoneOverridesTheConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{Tombstone: httpinbox.NoTombstone})
	off := f.handler(httpinbox.Route{Operation: "payments.off"})
	hour := f.handler(httpinbox.Route{Operation: "payments.hour", Tombstone: time.Hour})
	never := f.handler(httpinbox.Route{Operation: "payments.never", Tombstone: httpinbox.NoTombstone})
	for _, h := range []http.Handler{off, hour, never} {
		require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 5}`).Code)
	}
	f.elapse(httpinbox.DefaultExpiry+time.Second, "")

	require.Equal(t, http.StatusCreated, post(off, "k1", `{"amount": 5}`).Code, "the Config's NoTombstone")
	require.Equal(t, http.StatusCreated, post(never, "k1", `{"amount": 5}`).Code, "the route's NoTombstone")
	requireProblem(t, post(hour, "k1", `{"amount": 5}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	require.EqualValues(t, 5, f.runs.Load())

	f.elapse(time.Hour, "operation = 'payments.hour'")
	require.Equal(t, http.StatusCreated, post(hour, "k1", `{"amount": 5}`).Code, "the route's hour has passed")
	require.EqualValues(t, 6, f.runs.Load())

	require.Panics(t, func() { f.handler(httpinbox.Route{Operation: "payments.bad", Tombstone: -time.Hour}) })
}

// A key whose request never committed (a crash left it started) proves
// that nothing took effect: past its expiry it runs, tombstone or not.
func TestExpiredStartedKeyRunsDespiteItsTombstone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 5}`).Code)
	_, err := f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+` SET state = 'started',
		status_code = NULL, headers = NULL, body = NULL, completed_at = NULL, locked_until = now()`)
	require.NoError(t, err)
	f.elapse(httpinbox.DefaultExpiry+time.Second, "")

	rec := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.EqualValues(t, 2, f.runs.Load())
}

// A provider that redelivers an event after its Expiry gets 422 while the
// event's tombstone lasts: the handler never runs twice for the event.
func TestWebhookRedeliveredAfterItsExpiryIsRefusedFromItsTombstone(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{Expiry: time.Hour})
	body := `{"id":"evt_1","type":"capture.settled"}`
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/gateway", body, time.Now()).Code)
	f.elapse(time.Hour+time.Second, "")

	requireProblem(t, f.deliver("/webhooks/gateway", body, time.Now()), http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.eventRows("evt_1"))
}

// A bulk's item keys expire with their operation and keep its tombstone: a
// new operation that carries an expired item gets it rejected with
// IDEMPOTENCY_KEY_EXPIRED, and the item does not run again; once the
// tombstone has passed, the item key is new. Without tombstones an expired
// item runs again at once.
func TestBulkItemsAfterTheirExpiryAreRefusedFromTheirTombstone(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	require.Equal(t, http.StatusOK, post(f.h, "op-1", items("a=10", "b=20")).Code)
	f.elapse(httpinbox.DefaultExpiry+time.Second, "")

	requireProblem(t, post(f.h, "op-1", items("a=10", "b=20")), http.StatusUnprocessableEntity, httpinbox.CodeKeyExpired)
	second := post(f.h, "op-2", items("a=10", "c=30"))
	require.Equal(t, http.StatusMultiStatus, second.Code, second.Body.String())
	rs := results(t, second)
	require.Equal(t, "a:rejected c:accepted", statuses(rs))
	require.Contains(t, string(rs[0].Problem), httpinbox.CodeKeyExpired)
	require.EqualValues(t, 1, f.runsOf("a"), "the expired item did not run again")
	require.Equal(t, 3, f.count())

	f.elapse(httpinbox.DefaultTombstone, "idempotency_key = 'a'")
	third := post(f.h, "op-3", items("a=10"))
	require.Equal(t, http.StatusOK, third.Code, third.Body.String())
	require.Equal(t, "a:accepted", statuses(results(t, third)))
	require.EqualValues(t, 2, f.runsOf("a"), "forgotten, the item key is new")

	off := newBulkFixture(t, httpinbox.Config{Tombstone: httpinbox.NoTombstone}, httpinbox.Bulk{})
	require.Equal(t, http.StatusOK, post(off.h, "op-1", items("a=10")).Code)
	off.elapse(httpinbox.DefaultExpiry+time.Second, "")
	require.Equal(t, "a:accepted", statuses(results(t, post(off.h, "op-2", items("a=10")))))
	require.EqualValues(t, 2, off.runsOf("a"))
}
