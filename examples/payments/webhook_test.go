package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

const testWebhookSecret = "whsec_test"

// withWebhooks lets the API receive the gateway's webhooks.
func withWebhooks(c *apiConfig) { c.webhookSecret = []byte(testWebhookSecret) }

// gatewaySignature is the Gateway-Signature of body at t, computed as the
// scheme says, without the library: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>.
func gatewaySignature(secret, body string, t time.Time) string {
	h := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(h, "%d.%s", t.Unix(), body)
	return fmt.Sprintf("t=%d,v1=%s", t.Unix(), hex.EncodeToString(h.Sum(nil)))
}

// webhook posts body to POST /webhooks/gateway with the signature header
// (none when "").
func (e *apiEnv) webhook(body, signature string) reply {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/webhooks/gateway", strings.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/json")
	if signature != "" {
		req.Header.Set(signatureHeader, signature)
	}
	return e.do(req)
}

func (e *apiEnv) events() (rows, distinct int) {
	e.t.Helper()
	rows, distinct, err := eventRows(context.Background(), e.pool, e.tables)
	require.NoError(e.t, err)
	return rows, distinct
}

func TestGatewayWebhooksAppendOneRowPerEventWhateverTheDuplicates(t *testing.T) {
	t.Parallel()
	w := newEnv(t, faults{DropAfterChargeRate: 0.3}, nil, nil)
	e := startAPI(t, w.pool, w.tables, w.queue, withWebhooks)
	sender := w.gateway.sendWebhooks(webhookConfig{url: e.url + "/webhooks/gateway", secret: []byte(testWebhookSecret), dupRate: 1})
	runUntilCleanup(t, sender.run)

	var ids []string
	for i := range 5 {
		ids = append(ids, e.post("acme", "alice", fmt.Sprintf("k-%d", i), captureJSON(fmt.Sprintf("o-%d", i), 100+i, "EUR")).id(t))
	}
	for _, id := range ids {
		require.Equal(t, ledger.StatusSucceeded, w.waitEffect(id).Status)
	}
	waitFor(t, "every webhook delivered", func() bool {
		s := w.gateway.snapshot().Webhooks
		return s.Events == 5 && s.pending() == 0
	})
	s := w.gateway.snapshot().Webhooks
	require.Equal(t, int64(5), s.Delivered)
	require.Zero(t, s.Failed)
	require.Zero(t, s.Dropped)
	require.GreaterOrEqual(t, s.Deliveries, int64(15), "each event twice at once, and once more after its answer")
	rows, distinct := e.events()
	require.Equal(t, 5, rows, "one row per event, however often it came")
	require.Equal(t, 5, distinct)
	var matched int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+gatewayEventsTable(e.tables)+
		` WHERE type = 'capture.settled' AND capture_request_id = ANY($1)`, ids).Scan(&matched))
	require.Equal(t, 5, matched, "each event names its capture request")
	require.Equal(t, 5, e.count(`SELECT count(*) FROM `+e.tables.Table("http_keys")+` WHERE operation = 'webhook:gateway' AND caller = 'gateway'`))
}

func TestForgedStaleAndMissingGatewaySignaturesAreRefusedAndNothingIsStored(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, withWebhooks)
	body := `{"id":"evt_1","type":"capture.settled","data":{"captureRequestId":"cr_1"}}`
	now := time.Now()
	for name, c := range map[string]struct{ signature, code string }{
		"missing":        {"", httpinbox.CodeSignatureMissing},
		"another secret": {gatewaySignature("whsec_guess", body, now), httpinbox.CodeSignatureInvalid},
		"another body":   {gatewaySignature(testWebhookSecret, strings.Replace(body, "cr_1", "cr_2", 1), now), httpinbox.CodeSignatureInvalid},
		"stale":          {gatewaySignature(testWebhookSecret, body, now.Add(-6*time.Minute)), httpinbox.CodeSignatureStale},
		"ahead":          {gatewaySignature(testWebhookSecret, body, now.Add(6*time.Minute)), httpinbox.CodeSignatureStale},
		"garbage":        {"v1=abc", httpinbox.CodeSignatureInvalid},
	} {
		r := e.webhook(body, c.signature)
		r.requireProblem(t, http.StatusUnauthorized, c.code)
		require.Empty(t, r.header.Get(httpinbox.HeaderReplayed), name)
	}
	rows, _ := e.events()
	require.Zero(t, rows)
	require.Zero(t, e.keyRecords(), "nothing stored")

	ok := e.webhook(body, gatewaySignature(testWebhookSecret, body, now.Add(-4*time.Minute)))
	require.Equal(t, http.StatusNoContent, ok.status, string(ok.body))
	rows, _ = e.events()
	require.Equal(t, 1, rows)
}

func TestConcurrentDuplicateGatewayWebhooksAppendOneRow(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, withWebhooks)
	body := `{"id":"evt_dup","type":"capture.settled","data":{"captureRequestId":"cr_9","chargeId":"ch_9"}}`
	const n = 20
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = e.webhook(body, gatewaySignature(testWebhookSecret, body, time.Now()))
		})
	}
	close(start)
	wg.Wait()
	first := 0
	for _, r := range replies {
		require.Equal(t, http.StatusNoContent, r.status, string(r.body))
		if r.header.Get(httpinbox.HeaderReplayed) == "" {
			first++
		}
	}
	require.Equal(t, 1, first)
	rows, distinct := e.events()
	require.Equal(t, 1, rows)
	require.Equal(t, 1, distinct)
}

func TestWebhooksAreNotServedWithoutASecret(t *testing.T) {
	t.Parallel()
	e := newAPIEnv(t, nil)
	body := `{"id":"evt_1","type":"capture.settled","data":{}}`
	r := e.webhook(body, gatewaySignature("", body, time.Now()))
	require.Equal(t, http.StatusNotFound, r.status)
	rows, _ := e.events()
	require.Zero(t, rows)
}
