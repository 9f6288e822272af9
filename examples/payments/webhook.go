package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
)

// POST /webhooks/gateway receives the gateway's signed events:
//
//	Gateway-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//	{"id":"evt_…","type":"capture.settled","data":{"captureRequestId":"cr_…","chargeId":"ch_…",…}}
//
// The gateway delivers each event at least once, often more. The endpoint
// checks the signature (at most 5 minutes off) before it reads anything,
// then appends the event to gateway_events in the transaction that records
// its id: one row per event, however often it comes.
const (
	// webhookProvider names the gateway as the sender of its events.
	webhookProvider = "gateway"
	// signatureHeader carries the gateway's signature.
	signatureHeader = "Gateway-Signature"
	// webhookTolerance is how far a signed time may be from the clock.
	webhookTolerance = 5 * time.Minute
	// webhookExpiry is how long an event id is remembered: far longer than
	// the gateway retries an event.
	webhookExpiry = 7 * 24 * time.Hour
	// webhookSecretEnv holds the secret when -webhook-secret is not given.
	webhookSecretEnv = "PAYMENTS_WEBHOOK_SECRET"
)

// webhookSecretFlag registers -webhook-secret on fs, defaulting to
// $PAYMENTS_WEBHOOK_SECRET. The default is not printed by -help.
func webhookSecretFlag(fs *flag.FlagSet) *string {
	s := new(string)
	fs.StringVar(s, "webhook-secret", "", "secret the gateway signs its webhooks with (default: $"+webhookSecretEnv+")")
	return s
}

// webhookSecret is the flag's value, else the environment's.
func webhookSecret(flagValue string) []byte {
	if flagValue != "" {
		return []byte(flagValue)
	}
	return []byte(envOr(webhookSecretEnv, ""))
}

// gatewaySigner is the gateway's signature scheme with secret.
func gatewaySigner(secret []byte) *httpinbox.TimestampedHMAC {
	return &httpinbox.TimestampedHMAC{Header: signatureHeader, Secrets: [][]byte{secret}, Tolerance: webhookTolerance}
}

// createGatewayEventsSQL is the table of received events. It is
// append-only and has no unique key on purpose: the webhook's record is
// what keeps it to one row per event.
const createGatewayEventsSQL = `CREATE TABLE IF NOT EXISTS %s (
	event_id           text        NOT NULL,
	type               text        NOT NULL,
	capture_request_id text,
	data               jsonb       NOT NULL,
	received_at        timestamptz NOT NULL DEFAULT now()
)`

const insertGatewayEventSQL = `INSERT INTO %s (event_id, type, capture_request_id, data) VALUES ($1, $2, nullif($3, ''), $4)`

// gatewayEventsTable is the quoted name of the gateway_events table.
func gatewayEventsTable(t idem.Tables) string {
	return pgx.Identifier{t.WithDefaults().Schema, "gateway_events"}.Sanitize()
}

// gatewayEvent is a webhook's body.
type gatewayEvent struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// eventReceiver appends the gateway's events.
type eventReceiver struct {
	insert string
}

func newEventReceiver(tables idem.Tables) *eventReceiver {
	return &eventReceiver{insert: fmt.Sprintf(insertGatewayEventSQL, gatewayEventsTable(tables))}
}

// route returns the handler of POST /webhooks/gateway on m, checking
// signatures made with secret.
func (er *eventReceiver) route(m *httpinbox.Middleware, secret []byte) http.Handler {
	return m.Webhook(httpinbox.Webhook{
		Provider: webhookProvider,
		Verifier: gatewaySigner(secret),
		EventID:  httpinbox.EventIDField("id"),
		Expiry:   webhookExpiry,
	}, er.receive)
}

// receive is the webhook's handler, in the transaction of the event's
// record: one gateway_events row.
func (er *eventReceiver) receive(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
	var ev gatewayEvent
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
		return httpinbox.Response{}, httpinbox.Invalid(fmt.Errorf("event: %w", err))
	}
	if err := checkText("type", ev.Type); err != nil {
		return httpinbox.Response{}, httpinbox.Invalid(err)
	}
	var data struct {
		CaptureRequestID string `json:"captureRequestId"`
	}
	if len(ev.Data) == 0 || json.Unmarshal(ev.Data, &data) != nil {
		return httpinbox.Response{}, httpinbox.Invalid(errors.New("event: data must be an object"))
	}
	if _, err := tx.Exec(ctx, er.insert, httpinbox.FromContext(ctx).Key(), ev.Type, data.CaptureRequestID, ev.Data); err != nil {
		return httpinbox.Response{}, fmt.Errorf("webhook: append event: %w", err)
	}
	return httpinbox.Response{Status: http.StatusNoContent}, nil
}

// eventRows counts the gateway_events rows: all, and distinct event ids.
func eventRows(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) (rows, distinct int, err error) {
	err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+gatewayEventsTable(tables)).Scan(&rows, &distinct)
	return rows, distinct, err
}
