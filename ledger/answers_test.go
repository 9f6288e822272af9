package ledger_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

// chargingTarget performs a charge for every request it receives, by key,
// then answers with answer (the n-th request of the key, from 1).
type chargingTarget struct {
	*httptest.Server
	mu      sync.Mutex
	charges map[string]int
}

func newChargingTarget(t *testing.T, answer func(w http.ResponseWriter, n int)) *chargingTarget {
	t.Helper()
	ct := &chargingTarget{charges: map[string]int{}}
	ct.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		ct.mu.Lock()
		ct.charges[key]++
		n := ct.charges[key]
		ct.mu.Unlock()
		answer(w, n)
	}))
	t.Cleanup(ct.Close)
	return ct
}

func (ct *chargingTarget) chargesOf(key string) int {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.charges[key]
}

// cutAfterHeaders answers code's status line and headers promising a body,
// then closes the connection: a gateway whose upstream timed out mid-answer.
func cutAfterHeaders(code int) func(http.ResponseWriter, int) {
	return func(w http.ResponseWriter, _ int) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\npartial",
			code, http.StatusText(code))
		_ = buf.Flush()
		_ = conn.Close()
	}
}

func TestServerErrorsAfterAChargeAreUnknownAndNeverSentAgain(t *testing.T) {
	t.Parallel()
	answers := map[string]func(http.ResponseWriter, int){
		"502": func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusBadGateway) },
		"504": func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusGatewayTimeout) },
		"500": func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusInternalServerError) },
		"503 without Retry-After": func(w http.ResponseWriter, _ int) {
			w.WriteHeader(http.StatusServiceUnavailable)
		},
		"500 cut after its headers": cutAfterHeaders(http.StatusInternalServerError),
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			tg := newChargingTarget(t, answer)
			var effects []ledger.Effect
			for i := range 5 {
				effects = append(effects, ledger.Effect{Type: "charge", BusinessKey: fmt.Sprint("o-", i),
					Target: tg.URL, Request: []byte(`{"amount":5}`)})
			}
			entries := f.record(t, context.Background(), effects...)
			f.dispatch(t, ledger.DispatcherConfig{
				Executors:   map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{Deduplicates: false}},
				MaxAttempts: 3,
			})
			for _, e := range entries {
				got := f.waitFor(t, e.ID, status(ledger.StatusUnknown))
				require.True(t, got.MaybeSent, "an unknown effect may have been sent")
				require.Equal(t, 1, got.AttemptCount)
			}
			time.Sleep(300 * time.Millisecond) // backoffs are milliseconds: a retry would have come
			for _, e := range entries {
				require.Equal(t, 1, tg.chargesOf(e.IdempotencyKey), "charges for %s", e.BusinessKey)
				got, err := f.ledger.Get(context.Background(), e.ID)
				require.NoError(t, err)
				require.Equal(t, ledger.StatusUnknown, got.Status)
			}
		})
	}
}

func TestAnswersThatProveNothingWasDoneAreRetried(t *testing.T) {
	t.Parallel()
	answers := map[string]func(http.ResponseWriter, int){
		"429": func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusTooManyRequests) },
		"503 with Retry-After": func(w http.ResponseWriter, _ int) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		},
		"408": func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusRequestTimeout) },
	}
	for name, refuse := range answers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			tg := newChargingTarget(t, func(w http.ResponseWriter, n int) {
				if n == 1 {
					refuse(w, n)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
				Target: tg.URL, Request: []byte(`{}`)})[0]
			f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{}}})
			got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
			require.Equal(t, 2, got.AttemptCount)
			require.False(t, got.MaybeSent)
		})
	}
}

func TestInProgressConflictIsAskedAgainWithTheSameKey(t *testing.T) {
	t.Parallel()
	inProgress := map[string]func(http.ResponseWriter){
		"problem code": func(w http.ResponseWriter) {
			p := httpinbox.Problem(http.StatusConflict, httpinbox.CodeInProgress, "a request with this key is in progress")
			for k, vs := range p.Header {
				w.Header()[k] = vs
			}
			w.WriteHeader(p.Status)
			_, _ = w.Write(p.Body)
		},
		"Retry-After": func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
		},
		"Stripe's error code": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"idempotency_key_in_use","type":"idempotency_error"}}`))
		},
	}
	for name, answer := range inProgress {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			tg := newChargingTarget(t, func(w http.ResponseWriter, n int) {
				if n <= 2 {
					answer(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
				Target: tg.URL, Request: []byte(`{}`)})[0]
			f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{}}})
			got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
			require.Equal(t, 3, got.AttemptCount)
			require.Equal(t, 3, tg.chargesOf(e.IdempotencyKey), "every attempt carries the same key")
		})
	}
}

func TestInProgressAnswersThatRunOutEndUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newChargingTarget(t, func(w http.ResponseWriter, _ int) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusConflict)
	})
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
		Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:   map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{}},
		MaxAttempts: 3,
	})
	got := f.waitFor(t, e.ID, status(ledger.StatusUnknown))
	require.Equal(t, 3, got.AttemptCount)
	require.True(t, got.MaybeSent)
	require.Contains(t, got.LastError, "409")
}

func TestRetriesThatRunOutAfterAnAmbiguousAttemptEndUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newChargingTarget(t, func(w http.ResponseWriter, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway) // the charge may have happened
			return
		}
		w.WriteHeader(http.StatusTooManyRequests) // nothing done, but the first one may have been
	})
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
		Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:   map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{Deduplicates: true}},
		MaxAttempts: 3,
	})
	got := f.waitFor(t, e.ID, func(e ledger.Entry) bool {
		return e.Status == ledger.StatusUnknown || e.Status == ledger.StatusFailedTerminal
	})
	require.Equal(t, ledger.StatusUnknown, got.Status, "the first attempt may have charged: %s", got.LastError)
	require.Equal(t, 3, got.AttemptCount)
	require.Contains(t, got.LastError, "may have taken effect")
}

func TestRetriesThatRunOutWithNothingSentEndFailedTerminal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newChargingTarget(t, func(w http.ResponseWriter, _ int) { w.WriteHeader(http.StatusTooManyRequests) })
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
		Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:   map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{}},
		MaxAttempts: 3,
	})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedTerminal))
	require.Equal(t, 3, got.AttemptCount)
	require.False(t, got.MaybeSent)
}

// slowChargeAPI is idem's own HTTP edge in front of a handler that takes
// 1.5 s to charge: a 409 "in progress" answers a retry that arrives while
// the first request still runs. It returns the URL and a count of charges.
func slowChargeAPI(t *testing.T, f *fixture) (string, func() int) {
	t.Helper()
	ctx := context.Background()
	charges := pgx.Identifier{f.tables.Schema, "charges"}.Sanitize()
	_, err := f.pool.Exec(ctx, "CREATE TABLE "+charges+" (key text PRIMARY KEY)")
	require.NoError(t, err)
	m, err := httpinbox.New(f.pool, httpinbox.Config{Tables: f.tables, Caller: func(*http.Request) string { return "ledger" }})
	require.NoError(t, err)
	api := httptest.NewServer(m.Handle(httpinbox.Route{Operation: "charge"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-ctx.Done():
				return httpinbox.Response{}, ctx.Err()
			}
			key := httpinbox.FromContext(ctx).KeyID()
			if _, err := tx.Exec(ctx, "INSERT INTO "+charges+" (key) VALUES ($1)", key); err != nil {
				return httpinbox.Response{}, err
			}
			return httpinbox.JSON(http.StatusCreated, map[string]string{"charge": key})
		}))
	t.Cleanup(api.Close)
	count := func() int {
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+charges).Scan(&n))
		return n
	}
	return api.URL, count
}

// keepingProxy forwards to upstream and, as HAProxy does by default, keeps
// the upstream request going when its client goes away.
func keepingProxy(t *testing.T, upstream string) string {
	t.Helper()
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Neither the request's context nor the writer's CloseNotifier (which
		// ReverseProxy falls back to) tells the upstream call about the client.
		rp.ServeHTTP(struct{ http.ResponseWriter }{w}, r.WithContext(context.WithoutCancel(r.Context())))
	}))
	t.Cleanup(p.Close)
	return p.URL
}

func TestEffectsThroughASlowIdempotentAPIAreChargedOnceAndSucceed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, charges := slowChargeAPI(t, f)
	target := keepingProxy(t, api)
	var effects []ledger.Effect
	for i := range 5 {
		effects = append(effects, ledger.Effect{Type: "charge", BusinessKey: fmt.Sprint("o-", i),
			Target: target, Request: []byte(`{"amount":5}`)})
	}
	entries := f.record(t, context.Background(), effects...)
	client := &http.Client{Timeout: 500 * time.Millisecond}
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:       map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{Client: client, Deduplicates: true}},
		RetryBackoff:    100 * time.Millisecond,
		RetryBackoffMax: 400 * time.Millisecond,
	})
	for _, e := range entries {
		got := f.waitFor(t, e.ID, func(e ledger.Entry) bool {
			return e.Status == ledger.StatusSucceeded || e.Status == ledger.StatusFailedTerminal
		})
		require.Equal(t, ledger.StatusSucceeded, got.Status, "last error: %s", got.LastError)
	}
	require.Equal(t, 5, charges())
}

func TestEffectsToAnAPIThatNeverAnswersInTimeEndUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, charges := slowChargeAPI(t, f) // no proxy: each cut request cancels its handler
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1",
		Target: api, Request: []byte(`{"amount":5}`)})[0]
	client := &http.Client{Timeout: 300 * time.Millisecond}
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:   map[string]ledger.Executor{"charge": &ledger.HTTPExecutor{Client: client, Deduplicates: true}},
		MaxAttempts: 3,
	})
	got := f.waitFor(t, e.ID, func(e ledger.Entry) bool {
		return e.Status == ledger.StatusUnknown || e.Status == ledger.StatusFailedTerminal
	})
	require.Equal(t, ledger.StatusUnknown, got.Status, "last error: %s", got.LastError)
	require.Equal(t, 0, charges())
}
