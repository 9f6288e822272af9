package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/ledger"
)

// effectCapture is the ledger effect type of a card capture. The effect id,
// and so the Idempotency-Key the gateway sees, is derived from this type and
// the captureRequestId only (see captureKey).
const effectCapture = "capture"

// reasonCaptureConflict dead-letters a capture request whose id was used
// before for another order, amount or currency: processing it would either
// charge twice or silently drop a different charge.
const reasonCaptureConflict = "capture_request_conflict"

// captureKey is the Idempotency-Key sent to the gateway for a capture
// request: SHA-256 over the effect id, itself SHA-256 over "capture" and the
// captureRequestId. It depends on nothing else (not the message id, the
// amount, the attempt or the process), so every redelivery, producer retry,
// dispatcher retry and replay of the same capture request sends the same key.
func captureKey(captureRequestID string) string {
	return ledger.IdempotencyKey(ledger.EffectID(effectCapture, captureRequestID))
}

const insertPaymentSQL = `INSERT INTO %s
	(capture_request_id, order_id, amount, currency, message_id, correlation_id)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (capture_request_id) DO NOTHING`

const storedPaymentSQL = `SELECT order_id, amount, currency, message_id FROM %s WHERE capture_request_id = $1`

// captureHandler is the worker's business logic.
type captureHandler struct {
	insert, stored string
	ledger         *ledger.Ledger
	target         string // the gateway's capture endpoint
	log            *slog.Logger
}

func newCaptureHandler(tables idem.Tables, gatewayURL string, log *slog.Logger) (*captureHandler, error) {
	l, err := ledger.New(ledger.Config{Tables: tables})
	if err != nil {
		return nil, err
	}
	return &captureHandler{
		insert: fmt.Sprintf(insertPaymentSQL, paymentsTable(tables)),
		stored: fmt.Sprintf(storedPaymentSQL, paymentsTable(tables)),
		ledger: l,
		target: captureURL(gatewayURL),
		log:    log,
	}, nil
}

// handle validates the envelope, inserts the payment and records the capture
// effect, all in the runtime's transaction tx. A capture request seen before
// under another message id (the producer retried) is a business duplicate:
// acked, with no second payment and no second effect.
func (h *captureHandler) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	c, fresh, err := h.insertPayment(ctx, tx, m)
	if err != nil || !fresh {
		return err
	}
	_, err = h.ledger.Record(ctx, tx, ledger.Effect{
		Type:        effectCapture,
		BusinessKey: c.CaptureRequestID,
		Target:      h.target,
		Request:     c,
		Consumer:    consumerName,
		MessageID:   m.ID,
	})
	if errors.Is(err, ledger.ErrEffectConflict) {
		// Only reachable if the payment row was removed by hand and the
		// capture request came back with another body.
		return consumer.DeadLetter(reasonCaptureConflict, err)
	}
	if err != nil {
		return fmt.Errorf("payments: record capture %s: %w", c.CaptureRequestID, err)
	}
	return nil
}

// insertPayment validates m and inserts its payment row. fresh is false for a
// business duplicate, which the handler acks without recording anything.
func (h *captureHandler) insertPayment(ctx context.Context, tx pgx.Tx, m *consumer.Message) (c capture, fresh bool, err error) {
	c, err = parseEnvelope(m)
	if err != nil {
		return c, false, consumer.DeadLetter(reasonInvalidEnvelope, err)
	}
	tag, err := tx.Exec(ctx, h.insert, c.CaptureRequestID, c.OrderID, c.Amount, c.Currency, m.ID, m.CorrelationID)
	if err != nil {
		return c, false, fmt.Errorf("payments: insert payment %s: %w", c.CaptureRequestID, err)
	}
	if tag.RowsAffected() == 1 {
		return c, true, nil
	}
	var (
		stored     capture
		firstMsgID string
	)
	err = tx.QueryRow(ctx, h.stored, c.CaptureRequestID).Scan(&stored.OrderID, &stored.Amount, &stored.Currency, &firstMsgID)
	if err != nil {
		return c, false, fmt.Errorf("payments: read payment %s: %w", c.CaptureRequestID, err)
	}
	stored.CaptureRequestID = c.CaptureRequestID
	if stored != c {
		return c, false, consumer.DeadLetter(reasonCaptureConflict, fmt.Errorf(
			"capture request %s was first received in message %s for order %s, %d %s; this one asks for order %s, %d %s",
			c.CaptureRequestID, firstMsgID, stored.OrderID, stored.Amount, stored.Currency, c.OrderID, c.Amount, c.Currency))
	}
	h.log.Info("business duplicate: capture request already received, acking without a second payment",
		"capture_request_id", c.CaptureRequestID, "message_id", m.ID, "first_message_id", firstMsgID)
	return c, false, nil
}

// captureURL is the gateway's capture endpoint for base URL u.
func captureURL(u string) string { return strings.TrimRight(u, "/") + "/captures" }
