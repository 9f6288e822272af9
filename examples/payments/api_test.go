package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// apiEnv is one test's API, served on a free port with its outbox dispatcher
// and key cleanup running, until the test ends.
type apiEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	queue  string
	api    *api
	ledger *ledger.Ledger
	url    string
}

// newAPIEnv starts an API on a fresh schema that publishes to a plain queue
// of the test's own, with no worker behind it.
func newAPIEnv(t *testing.T, tune func(*apiConfig)) *apiEnv {
	t.Helper()
	pool, tables := testdb.Schema(t)
	require.NoError(t, createTables(context.Background(), pool, tables))
	queue := testbroker.Queue(t)
	_, err := testbroker.Channel(t).QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return startAPI(t, pool, tables, queue, tune)
}

// startAPI serves an API on pool and tables that publishes to queue.
func startAPI(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, queue string, tune func(*apiConfig)) *apiEnv {
	t.Helper()
	cfg := apiConfig{
		pool: pool, tables: tables, amqpURL: testbroker.URL(), queue: queue,
		wait: 10 * time.Second, logger: testLogger(), tuneDispatcher: fastDispatcher,
	}
	if tune != nil {
		tune(&cfg)
	}
	a, err := newAPI(cfg)
	require.NoError(t, err)
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	runUntilCleanup(t, func(ctx context.Context) error { return a.run(ctx, ln) })
	return &apiEnv{t: t, pool: pool, tables: tables, queue: queue, api: a, ledger: l, url: "http://" + ln.Addr().String()}
}

// reply is an answer of the API.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// captureStatus is the status document of a capture request: a 202's
// body, and GET /captures/{id}.
type captureStatus struct {
	OperationID      string          `json:"operationId"`
	State            string          `json:"state"`
	CaptureRequestID string          `json:"captureRequestId"`
	OrderID          string          `json:"orderId"`
	Amount           int64           `json:"amount"`
	Currency         string          `json:"currency"`
	Result           json.RawMessage `json:"result"`
}

// doc decodes a status document.
func (r reply) doc(t *testing.T) captureStatus {
	t.Helper()
	var s captureStatus
	require.NoError(t, json.Unmarshal(r.body, &s), string(r.body))
	return s
}

// id returns the captureRequestId of a 202.
func (r reply) id(t *testing.T) string {
	t.Helper()
	require.Equal(t, http.StatusAccepted, r.status, string(r.body))
	s := r.doc(t)
	require.NotEmpty(t, s.CaptureRequestID)
	require.Equal(t, s.CaptureRequestID, s.OperationID, "the capture request is the operation")
	return s.CaptureRequestID
}

// requireProblem checks that r is a problem with status and code.
func (r reply) requireProblem(t *testing.T, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.status, string(r.body))
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct{ Code string }
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, code, p.Code)
}

// captureJSON is a POST /captures body.
func captureJSON(orderID string, amount int, currency string) string {
	return fmt.Sprintf(`{"orderId":%q,"amount":%d,"currency":%q}`, orderID, amount, currency)
}

// newCaptureRequest is POST /captures with body, as tenant and caller, with
// key (no header when ""), to the API at url ("": in process).
func newCaptureRequest(url, tenant, caller, key, body string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, url+"/captures", strings.NewReader(body))
	if err != nil {
		panic(err) // the URL is the test's own
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(tenantHeader, tenant)
	req.Header.Set(callerHeader, caller)
	if key != "" {
		req.Header.Set(httpinbox.HeaderKey, key)
	}
	return req
}

// do sends req to the running API.
func (e *apiEnv) do(req *http.Request) reply {
	e.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// post sends POST /captures to the running API.
func (e *apiEnv) post(tenant, caller, key, body string) reply {
	e.t.Helper()
	return e.do(newCaptureRequest(e.url, tenant, caller, key, body))
}

// serve runs POST /captures through h in process.
func serve(h http.Handler, tenant, caller, key, body string) reply {
	req := newCaptureRequest("", tenant, caller, key, body)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return reply{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// get reads GET /captures/{id} as tenant and caller.
func (e *apiEnv) get(tenant, caller, id string) reply {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.url+"/captures/"+id, nil)
	require.NoError(e.t, err)
	req.Header.Set(tenantHeader, tenant)
	req.Header.Set(callerHeader, caller)
	return e.do(req)
}

func (e *apiEnv) count(sql string, args ...any) int {
	e.t.Helper()
	n, err := count(context.Background(), e.pool, sql, args...)
	require.NoError(e.t, err)
	return n
}

// keyRecords, apiCaptures and outbox count the http_keys records, the
// api_captures rows and the recorded outbox messages.
func (e *apiEnv) keyRecords() int {
	return e.count(`SELECT count(*) FROM ` + e.tables.Table("http_keys"))
}
func (e *apiEnv) apiCaptures() int {
	return e.count(`SELECT count(*) FROM ` + apiCapturesTable(e.tables))
}
func (e *apiEnv) outbox() int {
	return e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE effect_type = $1`, effectCaptureRequested)
}

// keyState returns the state of the only record with key.
func (e *apiEnv) keyState(key string) string {
	e.t.Helper()
	var s string
	require.NoError(e.t, e.pool.QueryRow(context.Background(),
		`SELECT state FROM `+e.tables.Table("http_keys")+` WHERE idempotency_key = $1`, key).Scan(&s))
	return s
}

// waitPublished waits until the outbox message of captureRequestID is
// confirmed by the broker and returns its entry.
func (e *apiEnv) waitPublished(captureRequestID string) ledger.Entry {
	e.t.Helper()
	var entry ledger.Entry
	waitFor(e.t, "outbox message of "+captureRequestID+" published", func() bool {
		var err error
		entry, err = e.ledger.Get(context.Background(), ledger.EffectID(effectCaptureRequested, captureRequestID))
		return err == nil && entry.Status == ledger.StatusSucceeded
	})
	return entry
}

// queued returns the number of messages ready in the test's queue.
func (e *apiEnv) queued() int {
	e.t.Helper()
	q, err := testbroker.Channel(e.t).QueueDeclarePassive(e.queue, true, false, false, false, nil)
	require.NoError(e.t, err)
	return q.Messages
}

// wantID is the captureRequestId a key gets.
func wantID(tenant, caller, key string) string {
	return "cr_" + httpinbox.KeyID(tenant, caller, apiOperation, key)[:24]
}

func TestTwentyConcurrentRequestsWithOneKeyChargeOnce(t *testing.T) {
	t.Parallel()
	w := newEnv(t, faults{}, nil, nil)
	e := startAPI(t, w.pool, w.tables, w.queue, nil)

	const n = 20
	replies := make([]reply, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = e.post("acme", "alice", "order-1001", captureJSON("o-1", 1234, "EUR"))
		})
	}
	close(start)
	wg.Wait()

	id := wantID("acme", "alice", "order-1001")
	first := 0
	for _, r := range replies {
		require.Equal(t, id, r.id(t), "every caller gets the same captureRequestId")
		require.Equal(t, "/captures/"+id, r.header.Get("Location"))
		require.Equal(t, id, r.header.Get(httpinbox.HeaderResourceID))
		if r.header.Get(httpinbox.HeaderReplayed) == "" {
			first++
		}
	}
	require.Equal(t, 1, first, "one request ran the handler, the others received its answer")

	capture := w.waitEffect(id)
	require.Equal(t, ledger.StatusSucceeded, capture.Status)
	published := e.waitPublished(id)
	require.Equal(t, 1, published.AttemptCount, "one publish")
	g := w.gateway.snapshot()
	require.Equal(t, int64(1), g.Charges)
	require.Equal(t, int64(1), g.Requests)
	require.Zero(t, g.DoubleCharges)
	require.Equal(t, []string{captureKey(id)}, w.gateway.keys())
	s := w.worker.consumer.Stats()
	require.Equal(t, int64(1), s.Processed, "one message reached the worker")
	require.Zero(t, s.Duplicates)
	require.Zero(t, s.DeadLettered)
	require.Equal(t, 1, e.keyRecords())
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, w.payments())

	// The worker received the message id and correlation id the outbox set.
	var messageID, correlationID string
	require.NoError(t, w.pool.QueryRow(context.Background(), `SELECT message_id, correlation_id FROM `+
		paymentsTable(w.tables)+` WHERE capture_request_id = $1`, id).Scan(&messageID, &correlationID))
	require.Equal(t, ledger.EffectID(effectCaptureRequested, id), messageID)
	require.Equal(t, id, correlationID)

	status := e.get("acme", "alice", id)
	require.Equal(t, http.StatusOK, status.status, string(status.body))
	doc := status.doc(t)
	require.Equal(t, captureStatus{OperationID: id, State: "succeeded", CaptureRequestID: id, OrderID: "o-1", Amount: 1234,
		Currency: "EUR", Result: doc.Result}, doc)
	var charge chargeResponse
	require.NoError(t, json.Unmarshal(doc.Result, &charge), "the gateway's answer is the result")
	require.Equal(t, chargeResponse{ChargeID: "ch_1", CaptureRequestID: id, Amount: 1234, Currency: "EUR", Status: "captured"}, charge)
	require.Empty(t, status.header.Get("Retry-After"))
}

func TestSameKeyWithAnotherAmountIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	id := e.post("acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR")).id(t)
	e.waitPublished(id)

	e.post("acme", "alice", "k-1", captureJSON("o-1", 999, "EUR")).
		requireProblem(t, http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	e.post("acme", "alice", "k-1", captureJSON("o-2", 1234, "EUR")).
		requireProblem(t, http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)

	require.Equal(t, 1, e.keyRecords())
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, e.queued())
	var amount int64
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT amount FROM `+apiCapturesTable(e.tables)+` WHERE capture_request_id = $1`, id).Scan(&amount))
	require.Equal(t, int64(1234), amount)
}

func TestReplayAfterCompletionIsByteIdenticalWithTheReplayHeader(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	first := e.post("acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR"))
	id := first.id(t)
	require.Empty(t, first.header.Get(httpinbox.HeaderReplayed))
	e.waitPublished(id)

	// The same request, spelled differently: JSON key order and whitespace
	// do not count.
	replay := e.post("acme", "alice", "k-1", `{ "currency": "EUR", "amount": 1234, "orderId": "o-1" }`)
	require.Equal(t, first.status, replay.status)
	require.Equal(t, first.body, replay.body, "byte-identical body")
	require.Equal(t, "true", replay.header.Get(httpinbox.HeaderReplayed))
	for _, h := range []string{"Content-Type", "Location", httpinbox.HeaderResourceID} {
		require.Equal(t, first.header.Get(h), replay.header.Get(h), h)
	}
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, e.queued())

	status := e.get("acme", "alice", id)
	require.Equal(t, http.StatusOK, status.status)
	require.Equal(t, "accepted", status.doc(t).State, "published; no worker runs in this test")
	require.Equal(t, "1", status.header.Get("Retry-After"))
	require.Equal(t, "1", first.header.Get("Retry-After"))
	require.Equal(t, first.body, status.body, "the 202's body is the status document")
}

func TestSameKeyFromAnotherTenantOrCallerIsAnotherCaptureRequest(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	body := captureJSON("o-1", 1234, "EUR")
	scopes := [][2]string{{"acme", "alice"}, {"globex", "alice"}, {"acme", "bob"}}
	ids := map[string]bool{}
	for _, s := range scopes {
		r := e.post(s[0], s[1], "k-1", body)
		require.Empty(t, r.header.Get(httpinbox.HeaderReplayed), "%v must not replay another scope's answer", s)
		id := r.id(t)
		require.Equal(t, wantID(s[0], s[1], "k-1"), id)
		ids[id] = true
		e.waitPublished(id)
	}
	require.Len(t, ids, 3)
	require.Equal(t, 3, e.keyRecords())
	require.Equal(t, 3, e.apiCaptures())
	require.Equal(t, 3, e.outbox())
	require.Equal(t, 3, e.queued())

	aliceAtAcme := wantID("acme", "alice", "k-1")
	require.Equal(t, http.StatusOK, e.get("acme", "alice", aliceAtAcme).status)
	require.Equal(t, http.StatusNotFound, e.get("globex", "alice", aliceAtAcme).status, "another tenant cannot read it")
	require.Equal(t, http.StatusNotFound, e.get("acme", "bob", aliceAtAcme).status, "another caller cannot read it")
}

// lostResponse is a ResponseWriter nobody reads: the process died after the
// transaction committed and before the response left.
type lostResponse struct{ h http.Header }

func (l *lostResponse) Header() http.Header         { return l.h }
func (l *lostResponse) Write(b []byte) (int, error) { return len(b), nil }
func (l *lostResponse) WriteHeader(int)             {}

func TestCrashAfterCommitBeforeTheResponseReplaysTheCommittedResult(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	req := newCaptureRequest("", "acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR"))
	e.api.handler().ServeHTTP(&lostResponse{h: http.Header{}}, req)
	require.Equal(t, "completed", e.keyState("k-1"))
	require.Equal(t, 1, e.apiCaptures())

	retry := e.post("acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR"))
	id := retry.id(t)
	require.Equal(t, wantID("acme", "alice", "k-1"), id)
	require.Equal(t, "true", retry.header.Get(httpinbox.HeaderReplayed), "the committed result, not a second run")
	require.Equal(t, 1, e.waitPublished(id).AttemptCount)
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, e.queued(), "one message on the queue")
}

func TestCrashBeforeCommitRunsOnceWhenTheLeaseExpires(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, func(c *apiConfig) { c.lease, c.wait = 200*time.Millisecond, 0 })
	var crash atomic.Bool
	crash.Store(true)
	mux := http.NewServeMux()
	mux.Handle("POST /captures", e.api.keys.Handle(httpinbox.Route{Operation: apiOperation},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			resp, err := e.api.createCapture(ctx, tx, r)
			if crash.Load() {
				panic(http.ErrAbortHandler) // dies after the inserts, before the commit
			}
			return resp, err
		}))
	body := captureJSON("o-1", 1234, "EUR")

	require.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(mux, "acme", "alice", "k-1", body) })
	require.Equal(t, "started", e.keyState("k-1"))
	require.Zero(t, e.apiCaptures(), "nothing of the crashed transaction exists")
	require.Zero(t, e.outbox())
	crash.Store(false)

	var took reply
	waitFor(t, "the crashed request's lease to expire", func() bool {
		took = serve(mux, "acme", "alice", "k-1", body)
		if took.status == http.StatusConflict {
			took.requireProblem(t, http.StatusConflict, httpinbox.CodeInProgress)
			return false
		}
		return true
	})
	id := took.id(t)
	require.Equal(t, wantID("acme", "alice", "k-1"), id)
	require.Empty(t, took.header.Get(httpinbox.HeaderReplayed), "the retry ran the handler")
	require.Equal(t, 1, e.waitPublished(id).AttemptCount)
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, e.queued())

	replay := serve(mux, "acme", "alice", "k-1", body)
	require.Equal(t, "true", replay.header.Get(httpinbox.HeaderReplayed))
	require.Equal(t, took.body, replay.body)
}

func TestExpiredKeysAreCleanedUpAndTheirKeyStillNamesOneCapture(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, func(c *apiConfig) { c.cleanupEvery = 20 * time.Millisecond })
	body := captureJSON("o-1", 1234, "EUR")
	id := e.post("acme", "alice", "k-1", body).id(t)
	e.waitPublished(id)
	expire := func() {
		_, err := e.pool.Exec(context.Background(),
			`UPDATE `+e.tables.Table("http_keys")+` SET expires_at = now() - interval '1 minute', forget_at = now() - interval '1 minute'`)
		require.NoError(t, err)
		waitFor(t, "the cleanup to delete the expired key", func() bool { return e.keyRecords() == 0 })
	}
	expire()

	// The key comes back after its record is gone: it runs as new, and
	// names the same capture request, which exists already.
	again := e.post("acme", "alice", "k-1", body)
	require.Equal(t, id, again.id(t))
	require.Empty(t, again.header.Get(httpinbox.HeaderReplayed), "the expired record is not replayed")
	require.Equal(t, 1, e.keyRecords())
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
	require.Equal(t, 1, e.waitPublished(id).AttemptCount, "no second message")
	require.Equal(t, 1, e.queued())

	// Once more expired, and now for another amount: the capture request
	// the key names is another one.
	expire()
	conflict := e.post("acme", "alice", "k-1", captureJSON("o-1", 999, "EUR"))
	conflict.requireProblem(t, http.StatusUnprocessableEntity, codeCaptureConflict)
	require.Equal(t, 1, e.apiCaptures())
	require.Equal(t, 1, e.outbox())
}

func TestHostileKeysAreRefusedAndNothingIsStored(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	h := e.api.handler()
	body := captureJSON("o-1", 1234, "EUR")
	for name, key := range map[string]string{
		"empty":              `""`,
		"too long":           strings.Repeat("k", httpinbox.DefaultMaxKeyLength+1),
		"NUL":                "k\x00",
		"control character":  "k\x01-1",
		"tab":                "k\t1",
		"space":              "k 1",
		"DEL":                "k\x7f",
		"newline":            "k\n1",
		"non-ASCII":          "ключ",
		"invalid UTF-8":      "k\xff",
		"backslash":          `k\1`,
		"quote inside":       `"k"1"`,
		"one quote only":     `"k`,
		"escape sequence":    "\x1b[31mred",
		"unicode line break": "k\u20281",
	} {
		r := serve(h, "acme", "alice", key, body)
		require.Equal(t, http.StatusBadRequest, r.status, name)
		r.requireProblem(t, http.StatusBadRequest, httpinbox.CodeInvalidKey)
	}
	serve(h, "acme", "alice", "", body).requireProblem(t, http.StatusBadRequest, httpinbox.CodeMissingKey)

	two := newCaptureRequest("", "acme", "alice", "k-1", body)
	two.Header.Add(httpinbox.HeaderKey, "k-2")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, two)
	require.Equal(t, http.StatusBadRequest, rec.Code, "two keys")

	for _, scope := range [][2]string{
		{"acme", "alice\x00"},
		{"acme", "alice\xff"},
		{"acme", strings.Repeat("a", 256)},
		{strings.Repeat("t", 256), "alice"},
	} {
		serve(h, scope[0], scope[1], "k-1", body).requireProblem(t, http.StatusBadRequest, httpinbox.CodeInvalidScope)
	}

	// Over the wire: a key past the limit is refused by the middleware, a
	// huge header by the server before any handler runs.
	e.post("acme", "alice", strings.Repeat("k", 4096), body).requireProblem(t, http.StatusBadRequest, httpinbox.CodeInvalidKey)
	huge := e.post("acme", "alice", strings.Repeat("k", 1<<20), body)
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, huge.status)

	require.Zero(t, e.keyRecords())
	require.Zero(t, e.apiCaptures())
	require.Zero(t, e.outbox())
}

func TestInvalidBodyIsRefusedAndTheKeyStaysUsable(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	for name, body := range map[string]string{
		"not JSON":          `amount=1234`,
		"empty":             ``,
		"no orderId":        `{"amount":1234,"currency":"EUR"}`,
		"no amount":         `{"orderId":"o-1","currency":"EUR"}`,
		"zero amount":       captureJSON("o-1", 0, "EUR"),
		"negative amount":   captureJSON("o-1", -5, "EUR"),
		"fractional amount": `{"orderId":"o-1","amount":12.34,"currency":"EUR"}`,
		"amount as string":  `{"orderId":"o-1","amount":"1234","currency":"EUR"}`,
		"huge amount":       `{"orderId":"o-1","amount":1e30,"currency":"EUR"}`,
		"lower-case":        captureJSON("o-1", 1234, "eur"),
		"four letters":      captureJSON("o-1", 1234, "EURO"),
		"unknown field":     `{"orderId":"o-1","amount":1234,"currency":"EUR","captureRequestId":"mine"}`,
		"two objects":       captureJSON("o-1", 1234, "EUR") + captureJSON("o-2", 1, "EUR"),
		"trailing brace":    captureJSON("o-1", 1234, "EUR") + "}",
		"orderId too long":  captureJSON(strings.Repeat("o", maxField+1), 1234, "EUR"),
		"orderId with NUL":  `{"orderId":"o\u0000","amount":1234,"currency":"EUR"}`,
	} {
		e.post("acme", "alice", "k-1", body).requireProblem(t, http.StatusBadRequest, httpinbox.CodeValidationFailed)
		require.Zero(t, e.keyRecords(), "%s: a refused request leaves no record", name)
	}
	require.Zero(t, e.apiCaptures())
	require.Zero(t, e.outbox())

	ok := e.post("acme", "alice", "k-1", captureJSON("o-1", 1234, "EUR"))
	require.Equal(t, wantID("acme", "alice", "k-1"), ok.id(t))
	require.Empty(t, ok.header.Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, e.apiCaptures())
}

// The demo passes again and again on one database and queue, as make demo
// run twice does: its checks count what this run did, not earlier runs.
func TestDemoOverHTTPChargesEachAcceptedKeyOnceRunAfterRun(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	require.NoError(t, createTables(context.Background(), pool, tables))
	queue := testbroker.Queue(t)
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		err := demo(context.Background(), demoConfig{
			pool: pool, tables: tables,
			publish:        publishConfig{amqpURL: testbroker.URL(), queue: queue, n: 20, dup: 0.3, retry: 0.2, bad: true},
			http:           httpDemoConfig{n: 60, dup: 0.3, retry: 0.3},
			edge:           edgeDemoConfig{bulkOps: 6, dupRate: 0.3},
			faults:         faults{FailRate: 0.2, DropAfterChargeRate: 0.2},
			gatewayTimeout: 10 * time.Second, timeout: 20 * time.Second,
			logger: testLogger(), workerLog: testLogger(), out: &out,
		})
		require.NoError(t, err, "run %d: %s", run, out.String())
		require.Contains(t, out.String(), "OK   one captureRequestId per Idempotency-Key (60 keys, 60 accepted, 60 ids, 0 answers naming another id)")
		require.Contains(t, out.String(), "OK   a key reused with another amount answered 422")
		require.Contains(t, out.String(), "OK   bulk: each item key accepted once")
		require.Contains(t, out.String(), "OK   webhooks: one gateway_events row per event")
		require.Contains(t, out.String(), "OK   webhooks: unsigned, forged and stale deliveries refused 401")
		require.Contains(t, out.String(), "OK   GET /captures/{id}: every accepted capture request succeeded")
		require.Contains(t, out.String(), "payments check: OK", "run %d", run)
	}
}

// The API's /readyz says 503 within seconds while its database refuses or
// stops answering, and 200 again once it is back: a load balancer stops
// sending it commands it could only fail.
func TestAPIIsNotReadyWithinSecondsWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(*faultproxy.Proxy){
		"refused":    (*faultproxy.Proxy).Refuse,
		"blackholed": (*faultproxy.Proxy).Stall,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, tables := testdb.Schema(t)
			require.NoError(t, createTables(context.Background(), pool, tables))
			queue := testbroker.Queue(t)
			proxied, proxy := testdb.Proxied(t)
			e := startAPI(t, proxied, tables, queue, nil)
			probes := health.Handler(e.api.reporters()...)
			readyz := func() int {
				rec := httptest.NewRecorder()
				probes.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, health.ReadinessPath, nil))
				return rec.Code
			}
			waitWithin(t, 15*time.Second, "ready", func() bool { return readyz() == http.StatusOK })

			fail(proxy)
			began := time.Now()
			waitWithin(t, 10*time.Second, "not ready", func() bool { return readyz() == http.StatusServiceUnavailable })
			t.Logf("not ready %s after the database was %s", time.Since(began).Round(time.Millisecond), name)

			proxy.Resume()
			waitWithin(t, 30*time.Second, "ready again", func() bool { return readyz() == http.StatusOK })
			r := e.post("acme", "alice", "k-after", captureJSON("o-after", 100, "EUR"))
			require.Equal(t, http.StatusAccepted, r.status, string(r.body))
		})
	}
}
