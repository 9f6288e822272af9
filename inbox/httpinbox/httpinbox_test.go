package httpinbox_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

type reply struct {
	status   int
	body     []byte
	replayed string
	retry    string
}

// fire sends n concurrent POSTs with one key to srv and returns the replies.
func fire(t *testing.T, url string, n int, key, body string) []reply {
	t.Helper()
	out := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set(httpinbox.HeaderKey, key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Error(err)
				return
			}
			out[i] = reply{resp.StatusCode, b, resp.Header.Get(httpinbox.HeaderReplayed), resp.Header.Get("Retry-After")}
		})
	}
	close(start)
	wg.Wait()
	return out
}

func TestConcurrentRequestsWithOneKeyExecuteOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		once.Do(func() { close(entered) })
		<-release // hold the key until every other request has been answered
		return f.pay(ctx, tx, r)
	})
	var answered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		answered.Add(1)
	}))
	t.Cleanup(srv.Close)

	const n = 20
	done := make(chan []reply)
	go func() { done <- fire(t, srv.URL, n, "k-concurrent", `{"amount": 10}`) }()
	<-entered
	require.Eventually(t, func() bool { return answered.Load() == n-1 }, 20*time.Second, 5*time.Millisecond)
	close(release)
	replies := <-done

	var first []byte
	conflicts := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			require.Nil(t, first, "only one request may run the handler")
			first = r.body
		case http.StatusConflict:
			conflicts++
			require.Equal(t, "1", r.retry)
			require.Contains(t, string(r.body), httpinbox.CodeInProgress)
		default:
			t.Fatalf("unexpected status %d: %s", r.status, r.body)
		}
	}
	require.Equal(t, n-1, conflicts)
	require.Equal(t, 1, f.count())
	require.Equal(t, 1, f.records())
	require.EqualValues(t, 1, f.runs.Load())

	again := fire(t, srv.URL, 1, "k-concurrent", `{"amount": 10}`)[0]
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, first, again.body, "the replay must be byte-identical")
	require.Equal(t, "true", again.replayed)
}

func TestConcurrentRequestsWithBoundedWaitAllReceiveTheStoredResponse(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{Wait: 20 * time.Second})
	srv := httptest.NewServer(f.handler(httpinbox.Route{}))
	t.Cleanup(srv.Close)

	replies := fire(t, srv.URL, 20, "k-wait", `{"amount": 10}`)
	fresh := 0
	for _, r := range replies {
		require.Equal(t, http.StatusCreated, r.status, string(r.body))
		require.Equal(t, replies[0].body, r.body)
		if r.replayed == "" {
			fresh++
		}
	}
	require.Equal(t, 1, fresh, "exactly one response is the original")
	require.Equal(t, 1, f.count())
	require.EqualValues(t, 1, f.runs.Load())
}

func TestReplayIsByteIdenticalWithReplayedHeader(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	first := post(h, "k1", `{"amount": 42, "currency": "EUR"}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.Empty(t, first.Header().Get(httpinbox.HeaderReplayed))

	second := post(h, "k1", `{"amount": 42, "currency": "EUR"}`)
	require.Equal(t, http.StatusCreated, second.Code)
	require.Equal(t, first.Body.Bytes(), second.Body.Bytes())
	require.Equal(t, "true", second.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, first.Header().Get("Location"), second.Header().Get("Location"))
	require.Equal(t, first.Header().Get("Content-Type"), second.Header().Get("Content-Type"))
	require.NotEmpty(t, second.Header().Get(httpinbox.HeaderResourceID))
	require.Equal(t, first.Header().Get(httpinbox.HeaderResourceID), second.Header().Get(httpinbox.HeaderResourceID))
	require.Equal(t, 1, f.count())
	require.Equal(t, "completed", f.state("k1"))
}

func TestSameKeyWithDifferentBodyIsRejectedAndExecutesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 42}`).Code)
	rec := post(h, "k1", `{"amount": 43}`)
	requireProblem(t, rec, http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	require.Equal(t, 1, f.count())
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.records())
}

func TestFingerprintUsesCanonicalJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	first := post(h, "k1", `{"amount": 42, "currency": "EUR"}`)
	require.Equal(t, http.StatusCreated, first.Code)
	reordered := post(h, "k1", "{\n  \"currency\" : \"EUR\",\n  \"amount\" : 42.0\n}")
	require.Equal(t, http.StatusCreated, reordered.Code, reordered.Body.String())
	require.Equal(t, "true", reordered.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, first.Body.Bytes(), reordered.Body.Bytes())
	require.Equal(t, 1, f.count())
}

// Go decodes {"amount":1,"AMOUNT":2} and {"AMOUNT":2,"amount":1} into
// different amounts: a retry with the other spelling is another request.
func TestFingerprintNeverEquatesBodiesThatDecodeDifferently(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	first := post(h, "k1", `{"amount":1,"AMOUNT":2}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.Contains(t, first.Body.String(), `"amount":2`)
	requireProblem(t, post(h, "k1", `{"AMOUNT":2,"amount":1}`), http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	again := post(h, "k1", `{"amount":1,"AMOUNT":2}`)
	require.Equal(t, "true", again.Header().Get(httpinbox.HeaderReplayed), "the same bytes are the same request")
	require.Equal(t, 1, f.count())
}

func TestFingerprintIgnoresHeadersButNotPath(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 1}`, "X-Request-Id", "a", "User-Agent", "one").Code)
	rec := post(h, "k1", `{"amount": 1}`, "X-Request-Id", "b", "User-Agent", "two")
	require.Equal(t, "true", rec.Header().Get(httpinbox.HeaderReplayed))

	req := httptest.NewRequest(http.MethodPost, "/payments?account=2", strings.NewReader(`{"amount": 1}`))
	req.Header.Set(httpinbox.HeaderKey, "k1")
	other := httptest.NewRecorder()
	h.ServeHTTP(other, req)
	requireProblem(t, other, http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	require.Equal(t, 1, f.count())
}

func TestKeyIsScopedByTenantCallerAndOperation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	pay := f.handler(httpinbox.Route{})
	refund := f.handler(httpinbox.Route{Operation: "payments.refund"})
	body := `{"amount": 5}`

	require.Equal(t, http.StatusCreated, post(pay, "shared", body, "X-Tenant-ID", "t1", "X-Test-Caller", "alice").Code)
	for _, rec := range []*httptest.ResponseRecorder{
		post(pay, "shared", body, "X-Tenant-ID", "t2", "X-Test-Caller", "alice"),
		post(pay, "shared", body, "X-Tenant-ID", "t1", "X-Test-Caller", "bob"),
		post(refund, "shared", body, "X-Tenant-ID", "t1", "X-Test-Caller", "alice"),
	} {
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed))
	}
	require.Equal(t, 4, f.count())
	require.Equal(t, 4, f.records())
	var ids int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(DISTINCT key_id) FROM `+f.payments).Scan(&ids))
	require.Equal(t, 4, ids, "each scope derives its own KeyID")

	replay := post(pay, "shared", body, "X-Tenant-ID", "t2", "X-Test-Caller", "alice")
	require.Equal(t, "true", replay.Header().Get(httpinbox.HeaderReplayed))
}

func TestKeyIDIsDerivedFromTheScope(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 1}`, "X-Tenant-ID", "acme").Code)
	var got string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT key_id FROM `+f.payments).Scan(&got))
	require.Equal(t, httpinbox.KeyID("acme", "test-client", "payments.create", "k1"), got)
	require.NotEqual(t, httpinbox.KeyID("acme", "", "payments.create", "k1"), httpinbox.KeyID("acm", "e", "payments.create", "k1"))
}

func TestValidationFailureIsNotStored(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	rec := post(h, "k1", `{"amount": -5}`)
	requireProblem(t, rec, http.StatusBadRequest, httpinbox.CodeValidationFailed)
	require.Contains(t, problemOf(t, rec)["detail"], "amount must be positive")
	require.Equal(t, 0, f.records())

	fixed := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusCreated, fixed.Code, "the client may fix the request and reuse the key")
	require.Empty(t, fixed.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.count())
}

func TestApplicationFailureIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	first := post(h, "k1", `{"amount": 5000}`)
	require.Equal(t, http.StatusPaymentRequired, first.Code)
	require.Equal(t, "failed_replayable", f.state("k1"))

	second := post(h, "k1", `{"amount": 5000}`)
	require.Equal(t, http.StatusPaymentRequired, second.Code)
	require.Equal(t, "true", second.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, first.Body.Bytes(), second.Body.Bytes())
	require.EqualValues(t, 1, f.runs.Load())
}

func TestHandlerErrorRollsBackAndReleasesTheKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var fail atomic.Bool
	fail.Store(true)
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		resp, err := f.pay(ctx, tx, r)
		if fail.Load() {
			return httpinbox.Response{}, io.ErrUnexpectedEOF // after the business write
		}
		return resp, err
	})

	requireProblem(t, post(h, "k1", `{"amount": 5}`), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.Equal(t, 0, f.count(), "the business write rolled back")
	require.Equal(t, "started", f.state("k1"))

	fail.Store(false)
	rec := post(h, "k1", `{"amount": 5}`)
	require.Equal(t, http.StatusCreated, rec.Code, "a released key runs again at once")
	require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.count())
}

func TestServerErrorResponseIsNotStored(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var calls atomic.Int64
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		if calls.Add(1) == 1 {
			if _, err := f.pay(ctx, tx, r); err != nil {
				return httpinbox.Response{}, err
			}
			return httpinbox.Problem(http.StatusServiceUnavailable, "DEPENDENCY_DOWN", "try later"), nil
		}
		return f.pay(ctx, tx, r)
	})
	require.Equal(t, http.StatusServiceUnavailable, post(h, "k1", `{"amount": 5}`).Code)
	require.Equal(t, 0, f.count())
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 5}`).Code)
	require.Equal(t, 1, f.count())
}

func TestUnknownOutcomeIsStoredAndNeverRunAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var calls atomic.Int64
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		calls.Add(1)
		return httpinbox.Unknown(httpinbox.Problem(http.StatusGatewayTimeout, "PROVIDER_TIMEOUT", "outcome unknown")), nil
	})
	first := post(h, "k1", `{}`)
	require.Equal(t, http.StatusGatewayTimeout, first.Code)
	require.Equal(t, "unknown", f.state("k1"))
	second := post(h, "k1", `{}`)
	require.Equal(t, http.StatusGatewayTimeout, second.Code)
	require.Equal(t, "true", second.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, first.Body.Bytes(), second.Body.Bytes())
	require.EqualValues(t, 1, calls.Load())
}

func TestMissingKeyIsProblemJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	rec := post(f.handler(httpinbox.Route{}), "", `{"amount": 5}`)
	requireProblem(t, rec, http.StatusBadRequest, httpinbox.CodeMissingKey)
	require.Equal(t, "urn:idem:problem:missing-idempotency-key", problemOf(t, rec)["type"])
	require.Equal(t, 0, f.records())
	require.EqualValues(t, 0, f.runs.Load())
}

func TestOptionalKeyRouteRunsWithoutRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var sawClaim atomic.Bool
	h := f.m.Handle(httpinbox.Route{Operation: "notes.create", KeyOptional: true}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		sawClaim.Store(httpinbox.FromContext(ctx) != nil)
		_, err := tx.Exec(ctx, `INSERT INTO `+f.payments+` (key_id, amount) VALUES ('', 1)`)
		return httpinbox.Response{Status: http.StatusNoContent}, err
	})
	require.Equal(t, http.StatusNoContent, post(h, "", `{}`).Code)
	require.Equal(t, http.StatusNoContent, post(h, "", `{}`).Code)
	require.False(t, sawClaim.Load())
	require.Equal(t, 2, f.count())
	require.Equal(t, 0, f.records())

	require.Equal(t, http.StatusNoContent, post(h, "k1", `{}`).Code)
	require.True(t, sawClaim.Load())
	require.Equal(t, "true", post(h, "k1", `{}`).Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 3, f.count())
}

func TestHostileKeysAreRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	for name, key := range map[string]string{
		"huge":        strings.Repeat("k", 256),
		"megabyte":    strings.Repeat("k", 1<<20),
		"control":     "abc\x01def",
		"nul":         "abc\x00def",
		"tab":         "abc\tdef",
		"delete":      "abc\x7fdef",
		"space":       "abc def",
		"non-ascii":   "ключ-1",
		"invalid-utf": "k\xff\xfe",
		"backslash":   `a\b`,
		"quotes-only": `""`,
		"inner-quote": `a"b`,
	} {
		rec := post(h, key, `{"amount": 1}`)
		require.Equal(t, http.StatusBadRequest, rec.Code, name)
		require.Equal(t, httpinbox.CodeInvalidKey, problemOf(t, rec)["code"], name)
	}

	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount": 1}`))
	req.Header.Add(httpinbox.HeaderKey, "a")
	req.Header.Add(httpinbox.HeaderKey, "b")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	requireProblem(t, rec, http.StatusBadRequest, httpinbox.CodeInvalidKey)

	requireProblem(t, post(h, "k1", `{"amount": 1}`, "X-Tenant-ID", "t\x00"), http.StatusBadRequest, httpinbox.CodeInvalidScope)
	require.Equal(t, 0, f.records())
	require.EqualValues(t, 0, f.runs.Load())

	// The longest key allowed, and the structured-field form, are accepted.
	require.Equal(t, http.StatusCreated, post(h, strings.Repeat("k", 255), `{"amount": 1}`).Code)
	require.Equal(t, http.StatusCreated, post(h, `"sf-key"`, `{"amount": 1}`).Code)
	require.Equal(t, "true", post(h, "sf-key", `{"amount": 1}`).Header().Get(httpinbox.HeaderReplayed))
}

func TestOversizedRequestBodyIsRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{MaxRequestBytes: 64})
	rec := post(f.handler(httpinbox.Route{}), "k1", `{"amount": 1, "currency": "`+strings.Repeat("x", 64)+`"}`)
	requireProblem(t, rec, http.StatusRequestEntityTooLarge, httpinbox.CodeRequestTooLarge)
	require.Equal(t, 0, f.records())
}

func TestOmittedBodyReplaysStatusHeadersAndResourceID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{MaxStoredBodyBytes: 16})
	for _, route := range []httpinbox.Route{
		{Operation: "cards.create", OmitBody: true},
		{Operation: "payments.create"}, // the body exceeds MaxStoredBodyBytes
	} {
		h := f.handler(route)
		first := post(h, "k1", `{"amount": 7, "currency": "EUR"}`)
		require.Equal(t, http.StatusCreated, first.Code)
		require.NotEmpty(t, first.Body.Bytes(), "the first caller receives the body")

		replay := post(h, "k1", `{"amount": 7, "currency": "EUR"}`)
		require.Equal(t, http.StatusCreated, replay.Code)
		require.Equal(t, "true", replay.Header().Get(httpinbox.HeaderReplayed))
		require.Empty(t, replay.Body.Bytes())
		require.Equal(t, first.Header().Get("Location"), replay.Header().Get("Location"))
		require.Equal(t, first.Header().Get(httpinbox.HeaderResourceID), replay.Header().Get(httpinbox.HeaderResourceID))
	}
	var stored int
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+f.tables.Table("http_keys")+` WHERE body IS NOT NULL OR NOT body_omitted`).Scan(&stored))
	require.Zero(t, stored)
}

func TestUnlistedHeadersAreNotStored(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.m.Handle(httpinbox.Route{Operation: "sessions.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		resp, err := httpinbox.JSON(http.StatusCreated, map[string]string{"ok": "yes"})
		resp.Header.Set("Set-Cookie", "session=secret")
		return resp, err
	})
	require.Equal(t, "session=secret", post(h, "k1", `{}`).Header().Get("Set-Cookie"))
	replay := post(h, "k1", `{}`)
	require.Empty(t, replay.Header().Get("Set-Cookie"))
	require.Equal(t, "application/json", replay.Header().Get("Content-Type"))
}

func TestNewKeysPerCallerAreLimited(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{NewKeysPerMinute: 2})
	h := f.handler(httpinbox.Route{})
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 1}`).Code)
	require.Equal(t, http.StatusCreated, post(h, "k2", `{"amount": 1}`).Code)
	rec := post(h, "k3", `{"amount": 1}`)
	requireProblem(t, rec, http.StatusTooManyRequests, httpinbox.CodeTooManyKeys)
	require.Equal(t, "60", rec.Header().Get("Retry-After"))

	require.Equal(t, "true", post(h, "k1", `{"amount": 1}`).Header().Get(httpinbox.HeaderReplayed), "replays are not limited")
	require.Equal(t, http.StatusCreated, post(h, "k3", `{"amount": 1}`, "X-Tenant-ID", "other").Code, "the limit is per caller")
	require.Equal(t, 3, f.count())
}

// With NoTombstone a key is forgotten at its expiry, as it was before
// tombstones: a retry after it runs as a new request.
func TestExpiredKeyRunsAsNewWithoutATombstone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{Tombstone: httpinbox.NoTombstone})
	h := f.handler(httpinbox.Route{})
	require.Equal(t, http.StatusCreated, post(h, "k1", `{"amount": 1}`).Code)
	_, err := f.pool.Exec(context.Background(), `UPDATE `+f.tables.Table("http_keys")+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)

	rec := post(h, "k1", `{"amount": 2}`)
	require.Equal(t, http.StatusCreated, rec.Code, "an expired key is forgotten, even with another body")
	require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 2, f.count())
	require.Equal(t, 1, f.records())
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []httpinbox.Config{
		{Expiry: time.Second, Lease: time.Minute},
		{Wait: -time.Second},
		{NewKeysPerMinute: -1},
		{SharedScope: true, Tombstone: -2 * time.Hour},
	} {
		_, err := httpinbox.New(nil, cfg)
		require.ErrorIs(t, err, httpinbox.ErrConfig)
	}
}

func TestRequestBodyReachesTheHandlerUnchanged(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var got []byte
	h := f.m.Handle(httpinbox.Route{Operation: "echo"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		b, err := io.ReadAll(r.Body)
		got = b
		return httpinbox.Response{Status: http.StatusOK, Body: b}, err
	})
	body := "{ \"b\": 1,\n \"a\": [1, 2] }"
	rec := post(h, "k1", body)
	require.Equal(t, http.StatusOK, rec.Code)
	require.True(t, bytes.Equal([]byte(body), got))
}

func TestHandlerCannotCommitTheTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		if _, err := f.pay(ctx, tx, r); err != nil {
			return httpinbox.Response{}, err
		}
		return httpinbox.Response{}, tx.Commit(ctx)
	})
	requireProblem(t, post(h, "k1", `{"amount": 5}`), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.Equal(t, 0, f.count(), "the business write must not commit without its record")
}
