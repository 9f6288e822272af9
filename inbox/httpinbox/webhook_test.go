package httpinbox_test

import (
	"context"
	"errors"
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

// hookFixture is a webhook endpoint whose handler appends every event it
// runs for to an events table without a unique key: only the middleware
// keeps it to one row per event.
type hookFixture struct {
	*fixture
	signer *httpinbox.TimestampedHMAC
	events string
	fail   atomic.Int64 // handler runs left that fail before writing
	h      http.Handler
}

func newHookFixture(t *testing.T, cfg httpinbox.Config, wh httpinbox.Webhook) *hookFixture {
	t.Helper()
	f := &hookFixture{fixture: newFixture(t, cfg),
		signer: &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{[]byte("whsec_test")}}}
	f.events = strings.Replace(f.payments, `"payments"`, `"events"`, 1)
	_, err := f.pool.Exec(context.Background(), `CREATE TABLE `+f.events+` (event_id text NOT NULL, provider text NOT NULL, tenant text NOT NULL, body text NOT NULL)`)
	require.NoError(t, err)
	if wh.Provider == "" {
		wh.Provider = "gateway"
	}
	if wh.Verifier == nil {
		wh.Verifier = f.signer
	}
	if wh.EventID == nil {
		wh.EventID = httpinbox.EventIDField("id")
	}
	f.h = f.m.Webhook(wh, f.record)
	return f
}

// record is the webhook handler: one events row, in the record's transaction.
func (f *hookFixture) record(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
	f.runs.Add(1)
	if f.fail.Add(-1) >= 0 {
		return httpinbox.Response{}, errors.New("database hiccup")
	}
	claim := httpinbox.FromContext(ctx)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return httpinbox.Response{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+f.events+` (event_id, provider, tenant, body) VALUES ($1, $2, $3, $4)`,
		claim.Key(), claim.Caller(), claim.Tenant(), string(body)); err != nil {
		return httpinbox.Response{}, err
	}
	return httpinbox.JSON(http.StatusOK, map[string]string{"received": claim.Key()})
}

// deliver sends body to the endpoint signed at t with the fixture's secret.
func (f *hookFixture) deliver(path, body string, t time.Time) *httptest.ResponseRecorder {
	return f.send(path, body, "Gateway-Signature", f.signer.Sign([]byte(body), t))
}

// send posts body to path with the given headers.
func (f *hookFixture) send(path, body string, header ...string) *httptest.ResponseRecorder {
	req := signed(body, header...)
	req.URL.Path = path
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	return rec
}

func (f *hookFixture) eventRows(id string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.events+` WHERE event_id = $1`, id).Scan(&n))
	return n
}

func TestConcurrentDuplicateWebhookDeliveriesRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{Wait: 20 * time.Second}, httpinbox.Webhook{})
	body := `{"id":"evt_1","type":"capture.settled","data":{"amount":1234}}`
	const n = 20
	replies := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			// Each retry of a provider is signed anew, a second apart.
			replies[i] = f.deliver("/webhooks/gateway", body, time.Now().Add(-time.Duration(i)*time.Second))
		})
	}
	close(start)
	wg.Wait()

	first := 0
	for _, r := range replies {
		require.Equal(t, http.StatusOK, r.Code, r.Body.String())
		require.JSONEq(t, `{"received":"evt_1"}`, r.Body.String())
		if r.Header().Get(httpinbox.HeaderReplayed) == "" {
			first++
		}
	}
	require.Equal(t, 1, first, "one delivery ran the handler, the others received its answer")
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.eventRows("evt_1"))
	var stored string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT body FROM `+f.events).Scan(&stored))
	require.Equal(t, body, stored, "the handler reads the raw body the signature covered")

	later := f.deliver("/webhooks/gateway", body, time.Now())
	require.Equal(t, "true", later.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.eventRows("evt_1"))
	keys, err := f.keys().List(context.Background(), httpinbox.KeyFilter{Operation: "webhook:gateway"})
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, []string{"", "gateway", "evt_1", "completed"}, []string{keys[0].Tenant, keys[0].Caller, keys[0].Key, string(keys[0].State)})
}

func TestForgedStaleAndMissingSignaturesAreRefusedAndNothingIsStored(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{})
	body := `{"id":"evt_1","type":"capture.settled"}`
	now := time.Now()
	forger := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{[]byte("guessed")}}
	for name, c := range map[string]struct {
		code   string
		body   string
		header []string
	}{
		"missing":       {httpinbox.CodeSignatureMissing, body, nil},
		"forged":        {httpinbox.CodeSignatureInvalid, body, []string{"Gateway-Signature", forger.Sign([]byte(body), now)}},
		"tampered body": {httpinbox.CodeSignatureInvalid, strings.Replace(body, "settled", "refunded", 1), []string{"Gateway-Signature", f.signer.Sign([]byte(body), now)}},
		"garbage":       {httpinbox.CodeSignatureInvalid, body, []string{"Gateway-Signature", "t=x,v1=y"}},
		"stale":         {httpinbox.CodeSignatureStale, body, []string{"Gateway-Signature", f.signer.Sign([]byte(body), now.Add(-10*time.Minute))}},
		"future":        {httpinbox.CodeSignatureStale, body, []string{"Gateway-Signature", f.signer.Sign([]byte(body), now.Add(10*time.Minute))}},
	} {
		rec := f.send("/webhooks/gateway", c.body, c.header...)
		requireProblem(t, rec, http.StatusUnauthorized, c.code)
		require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed), name)
	}
	require.Zero(t, f.runs.Load())
	require.Zero(t, f.records(), "nothing stored")
	require.Zero(t, f.eventRows("evt_1"))

	// Once the event is in, a forged or replayed-late copy still never
	// reaches its stored answer.
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/gateway", body, now).Code)
	requireProblem(t, f.send("/webhooks/gateway", body, "Gateway-Signature", forger.Sign([]byte(body), now)),
		http.StatusUnauthorized, httpinbox.CodeSignatureInvalid)
	requireProblem(t, f.deliver("/webhooks/gateway", body, now.Add(-time.Hour)), http.StatusUnauthorized, httpinbox.CodeSignatureStale)
	require.EqualValues(t, 1, f.runs.Load())
	require.Equal(t, 1, f.records())
}

func TestWebhookEventIDsAreScopedByProviderAndTenant(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{
		Tenant: func(r *http.Request, _ []byte) string { return strings.TrimPrefix(r.URL.Path, "/webhooks/") },
	})
	other := f.m.Webhook(httpinbox.Webhook{Provider: "other", Verifier: f.signer, EventID: httpinbox.EventIDField("id")}, f.record)
	body := `{"id":"evt_1"}`
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/acme", body, time.Now()).Code)
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/globex", body, time.Now()).Code)
	require.Equal(t, "true", f.deliver("/webhooks/acme", body, time.Now()).Header().Get(httpinbox.HeaderReplayed))
	req := signed(body, "Gateway-Signature", f.signer.Sign([]byte(body), time.Now()))
	rec := httptest.NewRecorder()
	other.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed), "another provider's evt_1 is another event")
	require.EqualValues(t, 3, f.runs.Load())
	require.Equal(t, 3, f.eventRows("evt_1"))
}

func TestWebhookEventRedeliveredWithAnotherBodyIsAConflict(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{})
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/gateway", `{"id":"evt_1","amount":1}`, time.Now()).Code)
	requireProblem(t, f.deliver("/webhooks/gateway", `{"id":"evt_1","amount":2}`, time.Now()),
		http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	require.Equal(t, 1, f.eventRows("evt_1"))
}

func TestWebhookWithoutAUsableEventIDIsRefused(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{})
	for _, body := range []string{`{"type":"x"}`, `{"id":42}`, `{"id":""}`, `{"ID":"evt_1"}`, `{"id":"evt 1"}`, `[1]`, `not json`} {
		requireProblem(t, f.deliver("/webhooks/gateway", body, time.Now()), http.StatusBadRequest, httpinbox.CodeInvalidEventID)
	}
	require.Zero(t, f.runs.Load())
	require.Zero(t, f.records())
}

func TestWebhookHandlerFailureRollsBackAndTheProvidersRetryRunsOnce(t *testing.T) {
	t.Parallel()
	f := newHookFixture(t, httpinbox.Config{}, httpinbox.Webhook{Expiry: 72 * time.Hour})
	f.fail.Store(1)
	body := `{"id":"evt_1"}`
	requireProblem(t, f.deliver("/webhooks/gateway", body, time.Now()), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.Zero(t, f.eventRows("evt_1"), "the failed run wrote nothing")
	require.Equal(t, "started", f.state("evt_1"), "released, not forgotten")
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/gateway", body, time.Now()).Code)
	require.Equal(t, http.StatusOK, f.deliver("/webhooks/gateway", body, time.Now()).Code)
	require.EqualValues(t, 2, f.runs.Load())
	require.Equal(t, 1, f.eventRows("evt_1"))

	rec, err := f.keys().Get(context.Background(), httpinbox.KeyID("", "gateway", "webhook:gateway", "evt_1"))
	require.NoError(t, err)
	require.WithinDuration(t, rec.CreatedAt.Add(72*time.Hour), rec.ExpiresAt, time.Second, "the provider's retry horizon, not the default expiry")
}

func TestWebhookConfigurationMistakesPanic(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	ok := httpinbox.Webhook{Provider: "gateway", EventID: httpinbox.EventIDField("id"),
		Verifier: &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{[]byte("s")}}}
	require.NotPanics(t, func() { f.m.Webhook(ok, f.pay) })
	for name, change := range map[string]func(*httpinbox.Webhook){
		"no provider":        func(w *httpinbox.Webhook) { w.Provider = "" },
		"no verifier":        func(w *httpinbox.Webhook) { w.Verifier = nil },
		"no event id":        func(w *httpinbox.Webhook) { w.EventID = nil },
		"no secret":          func(w *httpinbox.Webhook) { w.Verifier = &httpinbox.TimestampedHMAC{Header: "Gateway-Signature"} },
		"empty secret":       func(w *httpinbox.Webhook) { w.Verifier = httpinbox.GitHub([]byte{}) },
		"no header":          func(w *httpinbox.Webhook) { w.Verifier = &httpinbox.BodyHMAC{Secrets: [][]byte{[]byte("s")}} },
		"expiry below lease": func(w *httpinbox.Webhook) { w.Expiry = time.Second },
	} {
		wh := ok
		change(&wh)
		require.Panics(t, func() { f.m.Webhook(wh, f.pay) }, name)
	}
}
