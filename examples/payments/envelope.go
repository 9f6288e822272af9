package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/consumer"
)

// schemaVersion is the only envelope version this worker understands.
const schemaVersion = 1

// reasonInvalidEnvelope is the dead-letter reason of a message this worker
// cannot understand: bad JSON, a missing or unknown schemaVersion, a missing
// correlation id or field. A message without a message id never reaches the
// handler: the runtime dead-letters it with reason missing_message_id.
const reasonInvalidEnvelope = "invalid_envelope"

// captureRequested is the message body, as published.
type captureRequested struct {
	SchemaVersion    *int   `json:"schemaVersion"`
	CaptureRequestID string `json:"captureRequestId"`
	OrderID          string `json:"orderId"`
	Amount           *int64 `json:"amount"`
	Currency         string `json:"currency"`
}

// capture is a validated capture request: what the payments row holds and
// what the gateway receives.
type capture struct {
	CaptureRequestID string `json:"captureRequestId"`
	OrderID          string `json:"orderId"`
	Amount           int64  `json:"amount"`
	Currency         string `json:"currency"`
}

// maxField bounds the length of every text field of the envelope.
const maxField = 200

// parseEnvelope validates m's envelope and body. An error means the message
// can never be processed: dead-letter it with reasonInvalidEnvelope.
func parseEnvelope(m *consumer.Message) (capture, error) {
	if err := checkText("correlation id", m.CorrelationID); err != nil {
		return capture{}, err
	}
	var body captureRequested
	if err := json.Unmarshal(m.Body, &body); err != nil {
		return capture{}, fmt.Errorf("decode body: %w", err)
	}
	switch {
	case body.SchemaVersion == nil:
		return capture{}, errors.New("schemaVersion is missing")
	case *body.SchemaVersion != schemaVersion:
		return capture{}, fmt.Errorf("schemaVersion %d is not supported (want %d)", *body.SchemaVersion, schemaVersion)
	}
	if err := checkText("captureRequestId", body.CaptureRequestID); err != nil {
		return capture{}, err
	}
	if err := checkText("orderId", body.OrderID); err != nil {
		return capture{}, err
	}
	switch {
	case body.Amount == nil:
		return capture{}, errors.New("amount is missing")
	case *body.Amount <= 0:
		return capture{}, fmt.Errorf("amount %d is not positive (amounts are in minor units)", *body.Amount)
	}
	if !isCurrency(body.Currency) {
		return capture{}, fmt.Errorf("currency %q is not an ISO 4217 code", body.Currency)
	}
	return capture{
		CaptureRequestID: body.CaptureRequestID,
		OrderID:          body.OrderID,
		Amount:           *body.Amount,
		Currency:         body.Currency,
	}, nil
}

// checkText accepts non-empty UTF-8 text of at most maxField bytes without
// NUL (which PostgreSQL text cannot hold).
func checkText(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%s is missing", name)
	case len(v) > maxField:
		return fmt.Errorf("%s has %d bytes, limit is %d", name, len(v), maxField)
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		return fmt.Errorf("%s is not valid text", name)
	}
	return nil
}

// isCurrency reports whether s looks like an ISO 4217 code: three capitals.
func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
