package httpinbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// A payment provider delivers a signed event twice and a forger once: the
// handler runs for the first delivery only, the second gets its stored
// answer, and the forgery is refused before anything is read from it.
func ExampleMiddleware_Webhook() {
	ctx := context.Background()
	pool, tables, done := exampleenv.DB(ctx, "webhook", func(s string) string {
		return "CREATE TABLE " + s + ".gateway_events (event_id text NOT NULL, type text NOT NULL)" // no unique key
	})
	defer done()
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: tables, Logger: slog.New(slog.DiscardHandler),
		// The scope of Idempotency-Key routes (in production: the authenticated
		// principal); a webhook's key is scoped by its provider instead.
		Caller: func(r *http.Request) string { return "demo-user" }})
	if err != nil {
		log.Fatal(err)
	}
	events := pgx.Identifier{tables.Schema, "gateway_events"}.Sanitize()
	secret := []byte("whsec_example") // in production: from the environment, never in the code

	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/gateway", m.Webhook(httpinbox.Webhook{
		Provider: "gateway",
		// Gateway-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>, at most 5 minutes off.
		Verifier: &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{secret}, Tolerance: 5 * time.Minute},
		EventID:  httpinbox.EventIDField("id"), // read only once the signature checked out
		Expiry:   7 * 24 * time.Hour,           // longer than the provider retries
	}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		var ev struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			return httpinbox.Response{}, httpinbox.Invalid(err)
		}
		// Runs in the transaction that records the event id: one row per event.
		if _, err := tx.Exec(ctx, "INSERT INTO "+events+" (event_id, type) VALUES ($1, $2)", ev.ID, ev.Type); err != nil {
			return httpinbox.Response{}, err
		}
		return httpinbox.Response{Status: http.StatusNoContent}, nil
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	provider := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{secret}}
	forger := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{[]byte("guess")}}
	deliver := func(signer *httpinbox.TimestampedHMAC, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/gateway", strings.NewReader(body))
		req.Header.Set("Gateway-Signature", signer.Sign([]byte(body), time.Now()))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var p struct{ Code string }
		_ = json.Unmarshal(b, &p)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), p.Code)))
	}
	event := `{"id":"evt_1","type":"capture.settled","data":{"captureRequestId":"cr_1"}}`
	deliver(provider, event)
	deliver(provider, event) // the provider did not see the first answer
	deliver(forger, event)

	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+events).Scan(&n)
	fmt.Println("gateway_events:", n)
	// Output:
	// 204 replayed=""
	// 204 replayed="true"
	// 401 replayed="" WEBHOOK_SIGNATURE_INVALID
	// gateway_events: 1
}

// A provider's signature, made and checked: what a test (or a fake
// provider) sends, and what the endpoint accepts.
func ExampleTimestampedHMAC() {
	v := &httpinbox.TimestampedHMAC{Header: "Gateway-Signature", Secrets: [][]byte{[]byte("whsec_example")}}
	body := []byte(`{"id":"evt_1"}`)
	signedAt := time.Unix(1_700_000_000, 0)
	header := v.Sign(body, signedAt)
	fmt.Println(header)

	req := httptest.NewRequest(http.MethodPost, "/webhooks/gateway", nil)
	req.Header.Set("Gateway-Signature", header)
	fmt.Println(v.Verify(req, body, signedAt.Add(time.Minute)))
	fmt.Println(v.Verify(req, []byte(`{"id":"evt_2"}`), signedAt.Add(time.Minute)))
	fmt.Println(v.Verify(req, body, signedAt.Add(time.Hour)))
	// Output:
	// t=1700000000,v1=2f6f24854ba5c8d505c37e6fc0a06fc74456f1a4042208e7acdd4bd0bdbd599e
	// <nil>
	// httpinbox: webhook signature invalid: no v1 signature in Gateway-Signature matches
	// httpinbox: webhook signature outside its time tolerance: signed at 2023-11-14T22:13:20Z, 1h0m0s from now (tolerance 5m0s)
}
