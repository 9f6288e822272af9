package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
)

func TestParseEnvelopeRejectsWhatCannotBeCaptured(t *testing.T) {
	t.Parallel()
	valid := `{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","amount":1234,"currency":"EUR"}`
	cases := []struct {
		name, correlationID, body, err string
	}{
		{"missing correlation id", "", valid, "correlation id is missing"},
		{"malformed JSON", "c", `{"schemaVersion":1,`, "decode body"},
		{"missing schemaVersion", "c", `{"captureRequestId":"cr-1","orderId":"o-1","amount":1,"currency":"EUR"}`, "schemaVersion is missing"},
		{"unknown schemaVersion", "c", `{"schemaVersion":2,"captureRequestId":"cr-1","orderId":"o-1","amount":1,"currency":"EUR"}`, "schemaVersion 2 is not supported"},
		{"missing captureRequestId", "c", `{"schemaVersion":1,"orderId":"o-1","amount":1,"currency":"EUR"}`, "captureRequestId is missing"},
		{"NUL in captureRequestId", "c", `{"schemaVersion":1,"captureRequestId":"cr\u0000","orderId":"o-1","amount":1,"currency":"EUR"}`, "captureRequestId is not valid text"},
		{"missing orderId", "c", `{"schemaVersion":1,"captureRequestId":"cr-1","amount":1,"currency":"EUR"}`, "orderId is missing"},
		{"missing amount", "c", `{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","currency":"EUR"}`, "amount is missing"},
		{"fractional amount", "c", `{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","amount":12.5,"currency":"EUR"}`, "decode body"},
		{"zero amount", "c", `{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","amount":0,"currency":"EUR"}`, "amount 0 is not positive"},
		{"bad currency", "c", `{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","amount":1,"currency":"eur"}`, "not an ISO 4217 code"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseEnvelope(&consumer.Message{ID: "m-1", CorrelationID: tc.correlationID, Body: []byte(tc.body)})
			require.ErrorContains(t, err, tc.err)
		})
	}

	c, err := parseEnvelope(&consumer.Message{ID: "m-1", CorrelationID: "c", Body: []byte(valid)})
	require.NoError(t, err)
	require.Equal(t, capture{CaptureRequestID: "cr-1", OrderID: "o-1", Amount: 1234, Currency: "EUR"}, c)
}

func TestHandlerDeadLettersInvalidEnvelopes(t *testing.T) {
	t.Parallel()
	h := &captureHandler{}
	// The envelope is checked before the transaction is used.
	err := h.handle(t.Context(), nil, &consumer.Message{ID: "m-1", Body: []byte(`{}`)})
	var dl *idem.DeadLetterError
	require.True(t, errors.As(err, &dl), "got %v", err)
	require.Equal(t, reasonInvalidEnvelope, dl.Reason)
}

func TestCaptureKeyDependsOnlyOnTheCaptureRequestID(t *testing.T) {
	t.Parallel()
	// Golden value: SHA-256 over the effect id, itself SHA-256 over
	// "capture" and the captureRequestId (ledger.EffectID, IdempotencyKey).
	// If this changes, captures already sent would be charged again under a
	// new key after an upgrade.
	require.Equal(t, "8a1596a338ca2063f2630366a72ed866", captureKey("cr-1"))
	require.NotEqual(t, captureKey("cr-1"), captureKey("cr-2"))
}
