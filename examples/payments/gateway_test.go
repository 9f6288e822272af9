package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// post sends a capture to the gateway and returns status and body.
func post(t *testing.T, url, key, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/captures", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), nil
}

func newTestGateway(t *testing.T, f faults) (*gateway, string) {
	t.Helper()
	g := newGateway(f, testLogger())
	srv := httptest.NewServer(g.handler())
	t.Cleanup(srv.Close)
	return g, srv.URL
}

func TestGatewayHonoursIdempotencyKeys(t *testing.T) {
	t.Parallel()
	g, url := newTestGateway(t, faults{})
	first, firstBody, err := post(t, url, "k-1", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, first)

	again, againBody, err := post(t, url, "k-1", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, firstBody, againBody, "a retry gets the original answer")

	conflict, _, err := post(t, url, "k-1", body("cr-1", 200))
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, conflict)

	missing, _, err := post(t, url, "", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, missing)

	s := g.snapshot()
	require.Equal(t, int64(1), s.Charges)
	require.Equal(t, int64(1), s.Replays)
	require.Equal(t, int64(1), s.KeyConflicts)
	require.Zero(t, s.DoubleCharges)

	resp, err := http.Get(url + "/captures/k-1")
	require.NoError(t, err)
	lookup, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, firstBody, string(lookup))
}

func TestGatewayCountsACaptureChargedUnderTwoKeysAsDoubleCharge(t *testing.T) {
	t.Parallel()
	// What a key derived from the message id (not the captureRequestId)
	// would do on a producer retry.
	g, url := newTestGateway(t, faults{})
	for _, key := range []string{"from-message-1", "from-message-2"} {
		status, _, err := post(t, url, key, body("cr-1", 100))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
	}
	s := g.snapshot()
	require.Equal(t, int64(2), s.Charges)
	require.Equal(t, int64(1), s.DistinctCaptures)
	require.Equal(t, int64(1), s.DoubleCharges)
}

func TestGatewayDropsTheAnswerAfterCharging(t *testing.T) {
	t.Parallel()
	g, url := newTestGateway(t, faults{DropAfterChargeRate: 1})
	_, _, err := post(t, url, "k-1", body("cr-1", 100))
	require.Error(t, err, "the connection closes without an answer")
	require.Equal(t, int64(1), g.snapshot().Charges)

	// Only new charges are dropped: the retry gets the stored answer.
	status, _, err := post(t, url, "k-1", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	s := g.snapshot()
	require.Equal(t, int64(1), s.Charges)
	require.Equal(t, int64(1), s.Dropped)
	require.Equal(t, int64(1), s.Replays)
}

func TestGatewayInjectedFailureChargesNothing(t *testing.T) {
	t.Parallel()
	g, url := newTestGateway(t, faults{FailRate: 1})
	status, _, err := post(t, url, "k-1", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, status)
	g.setFaults(faults{})
	status, _, err = post(t, url, "k-1", body("cr-1", 100))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, int64(1), g.snapshot().Charges)
}

func TestGatewayRetriesAWebhookUntilItIsAnswered(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if gatewaySigner([]byte("s")).Verify(r, body, time.Now()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable) // down for the first two deliveries
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	g, url := newTestGateway(t, faults{})
	runUntilCleanup(t, g.sendWebhooks(webhookConfig{url: receiver.URL, secret: []byte("s")}).run)
	status, _, err := post(t, url, "k-1", `{"captureRequestId":"cr-1","orderId":"o-1","amount":5,"currency":"EUR"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	waitFor(t, "the webhook delivered", func() bool { return g.snapshot().Webhooks.Delivered == 1 })
	s := g.snapshot().Webhooks
	require.Equal(t, webhookStats{Events: 1, Deliveries: 3, Retries: 2, Delivered: 1}, s)
}
