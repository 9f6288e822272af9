package httpinbox_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// unknownHandler answers every request with an outcome it cannot prove and
// counts its runs.
func unknownHandler(f *fixture, runs *atomic.Int64) http.Handler {
	return f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		runs.Add(1)
		return httpinbox.Unknown(httpinbox.Problem(http.StatusGatewayTimeout, "PROVIDER_TIMEOUT", "outcome unknown")), nil
	})
}

func (f *fixture) keys() *httpinbox.Keys {
	k, err := httpinbox.NewKeys(f.pool, f.tables)
	require.NoError(f.t, err)
	return k
}

func TestUnknownKeyIsConfirmedByAnOperatorWithAnAuditRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	h := unknownHandler(f, &runs)
	first := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusGatewayTimeout, first.Code)
	keys := f.keys()
	ctx := context.Background()

	unknown, err := keys.List(ctx, httpinbox.KeyFilter{State: httpinbox.KeyUnknown})
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	rec := unknown[0]
	require.Equal(t, httpinbox.KeyID("", "test-client", "payments.create", "k1"), rec.KeyID)
	require.Equal(t, "k1", rec.Key)
	require.Equal(t, http.StatusGatewayTimeout, rec.Status)
	require.Equal(t, first.Body.Bytes(), rec.Body)
	require.Equal(t, []string{"application/problem+json"}, rec.Header["Content-Type"])
	require.False(t, rec.CompletedAt.IsZero())

	_, err = keys.Resolve(ctx, rec.KeyID, httpinbox.KeyResolution{As: httpinbox.KeyCompleted, Operator: "alice"})
	require.Error(t, err, "a reason is required")
	done, err := keys.Resolve(ctx, rec.KeyID, httpinbox.KeyResolution{
		As: httpinbox.KeyCompleted, Reason: "the provider's dashboard shows the payment", Operator: "alice"})
	require.NoError(t, err)
	require.Equal(t, httpinbox.KeyCompleted, done.State)

	again := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, "true", again.Header().Get(httpinbox.HeaderReplayed), "the stored answer stays")
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	require.EqualValues(t, 1, runs.Load())

	history, err := keys.History(ctx, rec.KeyID)
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, []string{"alice", "unknown", "completed", "the provider's dashboard shows the payment"},
		[]string{history[0].Operator, string(history[0].From), string(history[0].To), history[0].Reason})

	_, err = keys.Resolve(ctx, rec.KeyID, httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "x", Operator: "bob"})
	require.ErrorIs(t, err, httpinbox.ErrKeyNotResolvable, "a stored response is never thrown away")
	_, err = keys.Get(ctx, httpinbox.KeyID("", "test-client", "payments.create", "other"))
	require.ErrorIs(t, err, httpinbox.ErrKeyNotFound)
	_, err = keys.Get(ctx, "not-hex")
	require.ErrorIs(t, err, httpinbox.ErrKeyNotFound)
}

// An unknown outcome may have happened: its record outlives its expiry,
// through cleanup and through a request with its key, which is answered
// from the record and never runs again, until an operator resolves it.
func TestUnknownKeyOutlivesItsExpiryUntilResolved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	h := unknownHandler(f, &runs)
	first := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusGatewayTimeout, first.Code)
	expire := func() {
		_, err := f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+` SET expires_at = now() - interval '1 second'`)
		require.NoError(t, err)
	}
	expire()
	ctx := context.Background()
	n, err := f.m.Cleanup(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "cleanup spares an unknown record")
	n, err = httpinbox.CleanupExpired(ctx, f.pool, f.tables, 10)
	require.NoError(t, err)
	require.Zero(t, n, "so does the operator's cleanup")

	again := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, "true", again.Header().Get(httpinbox.HeaderReplayed), "an expired unknown key is replayed")
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	requireProblem(t, post(h, "k1", `{"amount": 6}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	require.EqualValues(t, 1, runs.Load())
	require.Equal(t, "unknown", f.state("k1"))

	_, err = f.keys().Resolve(ctx, httpinbox.KeyID("", "test-client", "payments.create", "k1"), httpinbox.KeyResolution{
		As: httpinbox.KeyCompleted, Reason: "the provider confirmed it", Operator: "alice"})
	require.NoError(t, err)
	f.elapse(forgotten, "")
	n, err = f.m.Cleanup(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n, "once resolved, the record expires like any other")
}

func TestHandedBackKeyRunsOnceMoreForTheSameRequestOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	require.Equal(t, http.StatusGatewayTimeout, post(unknownHandler(f, &runs), "k1", `{"amount": 5}`).Code)
	keys := f.keys()
	id := httpinbox.KeyID("", "test-client", "payments.create", "k1")
	rec, err := keys.Resolve(context.Background(), id, httpinbox.KeyResolution{
		As: httpinbox.KeyStarted, Reason: "the provider never received it", Operator: "alice"})
	require.NoError(t, err)
	require.Equal(t, httpinbox.KeyStarted, rec.State)
	require.Nil(t, rec.Body)

	// The same key for another request is still a conflict; the same request
	// runs the (now healthy) handler once more, and is then replayed.
	h := f.handler(httpinbox.Route{})
	requireProblem(t, post(h, "k1", `{"amount": 6}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	ran := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusCreated, ran.Code, ran.Body.String())
	require.Empty(t, ran.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, "true", post(h, "k1", `{"amount": 5}`).Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.count())
	require.Equal(t, "completed", f.state("k1"))
	got, err := keys.Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, 2, got.Attempts)
}

func TestKeyHeldByARunningHandlerCannotBeResolved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		close(entered)
		<-release
		return f.pay(ctx, tx, r)
	})
	done := make(chan int, 1)
	go func() { done <- post(h, "k1", `{"amount": 5}`).Code }()
	<-entered
	keys := f.keys()
	id := httpinbox.KeyID("", "test-client", "payments.create", "k1")
	started, err := keys.List(context.Background(), httpinbox.KeyFilter{State: httpinbox.KeyStarted, Key: "k1"})
	require.NoError(t, err)
	require.Len(t, started, 1)
	require.NotEmpty(t, started[0].LockOwner)
	_, err = keys.Resolve(context.Background(), id, httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "stuck?", Operator: "alice"})
	require.ErrorIs(t, err, httpinbox.ErrKeyInFlight)
	_, err = keys.Resolve(context.Background(), id, httpinbox.KeyResolution{As: httpinbox.KeyCompleted, Reason: "x", Operator: "alice"})
	require.ErrorIs(t, err, httpinbox.ErrKeyInFlight)
	close(release)
	select {
	case code := <-done:
		require.Equal(t, http.StatusCreated, code)
	case <-time.After(20 * time.Second):
		t.Fatal("the held request did not finish")
	}
	_, err = keys.Resolve(context.Background(), id, httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "x", Operator: "alice"})
	require.ErrorIs(t, err, httpinbox.ErrKeyNotResolvable)
	require.Equal(t, 1, f.count())
}
