package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

func TestDuplicateDeliveriesCallTheGatewayOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	for range 3 {
		e.publish("m-1", "corr-1", body("cr-1", 1234))
	}
	s := e.waitSettled(3)
	entry := e.waitEffect("cr-1")

	require.Equal(t, int64(1), s.Processed)
	require.Equal(t, int64(2), s.Duplicates)
	require.Equal(t, ledger.StatusSucceeded, entry.Status)
	require.Equal(t, captureKey("cr-1"), entry.IdempotencyKey)
	require.Equal(t, "m-1", entry.MessageID)
	require.JSONEq(t, `{"captureRequestId":"cr-1","orderId":"o-1","amount":1234,"currency":"EUR"}`, string(entry.Request))
	g := e.gateway.snapshot()
	require.Equal(t, int64(1), g.Requests)
	require.Equal(t, int64(1), g.Charges)
	require.Equal(t, []string{captureKey("cr-1")}, e.gateway.keys())
	require.Equal(t, 1, e.payments())
	require.Equal(t, 1, e.effects())
}

func TestProducerRetryIsABusinessDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	// The producer did not get its confirm and sent the request again under
	// a new message id.
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	e.publish("m-2", "corr-1", body("cr-1", 1234))
	s := e.waitSettled(2)
	entry := e.waitEffect("cr-1")

	require.Equal(t, int64(2), s.Processed, "a business duplicate is acked as processed")
	require.Zero(t, s.DeadLettered)
	require.Equal(t, ledger.StatusSucceeded, entry.Status)
	require.Equal(t, 1, e.payments())
	require.Equal(t, 1, e.effects())
	g := e.gateway.snapshot()
	require.Equal(t, int64(1), g.Charges)
	require.Equal(t, int64(1), g.Requests)
}

func TestProducerRetryWithAnotherAmountIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	e.waitSettled(1)
	e.publish("m-2", "corr-2", body("cr-1", 9999))
	s := e.waitSettled(2)

	require.Equal(t, int64(1), s.DeadLettered)
	require.Equal(t, map[string]string{"m-2": reasonCaptureConflict}, e.dlq(1))
	require.Equal(t, reasonCaptureConflict, e.deadLetterReason("m-2"))
	require.Equal(t, ledger.StatusSucceeded, e.waitEffect("cr-1").Status)
	require.Equal(t, 1, e.payments())
	require.Equal(t, 1, e.effects())
	require.Equal(t, int64(1), e.gateway.snapshot().Charges)
}

func TestSameMessageIDWithAnotherPayloadIsDeadLetteredAsConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	e.waitSettled(1)
	e.publish("m-1", "corr-1", body("cr-1", 4321))
	s := e.waitSettled(2)

	require.Equal(t, int64(1), s.Conflicts)
	require.Equal(t, map[string]string{"m-1": "payload_conflict"}, e.dlq(1))
	require.Equal(t, "payload_conflict", e.deadLetterReason("m-1"))
	require.Equal(t, ledger.StatusSucceeded, e.waitEffect("cr-1").Status)
	require.Equal(t, 1, e.payments())
	require.Equal(t, int64(1), e.gateway.snapshot().Charges)
}

func TestInvalidEnvelopeIsDeadLetteredWithReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{}, nil, nil)
	e.publish("no-correlation-id", "", body("cr-1", 100))
	e.publish("unknown-schema-version", "corr", `{"schemaVersion":2,"captureRequestId":"cr-2","orderId":"o-1","amount":100,"currency":"EUR"}`)
	e.publish("no-capture-request-id", "corr", `{"schemaVersion":1,"orderId":"o-1","amount":100,"currency":"EUR"}`)
	e.publish("malformed", "corr", `{"schemaVersion":1,"captureRequestId":`)
	s := e.waitSettled(4)

	require.Equal(t, int64(4), s.DeadLettered)
	want := map[string]string{
		"no-correlation-id":      reasonInvalidEnvelope,
		"unknown-schema-version": reasonInvalidEnvelope,
		"no-capture-request-id":  reasonInvalidEnvelope,
		"malformed":              reasonInvalidEnvelope,
	}
	require.Equal(t, want, e.dlq(4))
	for id := range want {
		require.Equal(t, reasonInvalidEnvelope, e.deadLetterReason(id), "dead_letters row of %s", id)
	}
	require.Zero(t, e.payments())
	require.Zero(t, e.effects())
	require.Zero(t, e.gateway.snapshot().Requests)
}

func TestGatewayOutageIsRetriedUntilChargedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, faults{FailRate: 1}, nil, nil)
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	waitFor(t, "two failed gateway calls", func() bool { return e.gateway.snapshot().Failed >= 2 })
	e.gateway.setFaults(faults{}) // the provider recovers
	entry := e.waitEffect("cr-1")

	require.Equal(t, ledger.StatusSucceeded, entry.Status)
	require.GreaterOrEqual(t, entry.AttemptCount, 3)
	g := e.gateway.snapshot()
	require.Equal(t, int64(1), g.Charges)
	require.Equal(t, g.Failed+1, g.Requests)
	require.Equal(t, []string{captureKey("cr-1")}, e.gateway.keys())
}

func TestAnswerLostAfterChargeIsRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	// Without keep-alive every call is on a fresh connection, so the HTTP
	// client never resends by itself: the retry is the dispatcher's.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	e := newEnv(t, faults{DropAfterChargeRate: 1}, client, nil)
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	entry := e.waitEffect("cr-1")

	require.Equal(t, ledger.StatusSucceeded, entry.Status, "the unknown outcome is retried because the gateway deduplicates")
	require.Equal(t, 2, entry.AttemptCount)
	g := e.gateway.snapshot()
	require.Equal(t, int64(1), g.Dropped)
	require.Equal(t, int64(2), g.Requests)
	require.Equal(t, int64(1), g.Replays, "the second call carried the first call's key")
	require.Equal(t, int64(1), g.Charges)
	require.Zero(t, g.DoubleCharges)
	require.Equal(t, []string{captureKey("cr-1")}, e.gateway.keys())
}

func TestUnknownCaptureIsSettledFromTheGatewayByKey(t *testing.T) {
	t.Parallel()
	// The gateway always answers too late: every attempt times out after the
	// request left, and after MaxAttempts the effect stays unknown.
	client := &http.Client{Timeout: 100 * time.Millisecond}
	e := newEnv(t, faults{SlowRate: 1, SlowDelay: time.Minute}, client,
		func(d *ledger.DispatcherConfig) { d.MaxAttempts = 2 })
	e.publish("m-1", "corr-1", body("cr-1", 1234))
	entry := e.waitEffect("cr-1")
	require.Equal(t, ledger.StatusUnknown, entry.Status)
	require.Equal(t, 2, entry.AttemptCount)
	require.Equal(t, int64(1), e.gateway.snapshot().Charges, "the retry carried the same key")

	// The operator's procedure: ask the gateway about the effect's key, then
	// record the answer.
	resp, err := http.Get(entry.Target + "/" + entry.IdempotencyKey)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the gateway charged under this key")
	resolved, err := e.ledger.Resolve(context.Background(), entry.ID, ledger.Resolution{
		As: ledger.StatusSucceeded, Reason: "gateway has a capture under this key", Operator: "test"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, resolved.Status)
}

func TestDemoChargesEachCaptureRequestOnce(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	require.NoError(t, createTables(context.Background(), pool, tables))
	var out bytes.Buffer
	err := demo(context.Background(), demoConfig{
		pool: pool, tables: tables,
		publish:        publishConfig{amqpURL: testbroker.URL(), queue: testbroker.Queue(t), n: 200, dup: 0.3, retry: 0.2, bad: true},
		faults:         faults{FailRate: 0.2, DropAfterChargeRate: 0.2},
		gatewayTimeout: 10 * time.Second, timeout: 20 * time.Second,
		logger: testLogger(), workerLog: testLogger(), out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "payments check: OK")
}

// The demo on partitions: the worker consumes 3 partitions behind the
// queue's exchange, the publisher keys each message by its capture request,
// and each capture request is charged once.
func TestDemoOnPartitionsChargesEachCaptureRequestOnce(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	require.NoError(t, createTables(context.Background(), pool, tables))
	queue := testbroker.Queue(t)
	testbroker.PartitionsAtEnd(t, queue, 3)
	var out bytes.Buffer
	err := demo(context.Background(), demoConfig{
		pool: pool, tables: tables,
		publish:        publishConfig{amqpURL: testbroker.URL(), queue: queue, partitions: 3, n: 100, dup: 0.3, retry: 0.2, bad: true},
		faults:         faults{FailRate: 0.2},
		gatewayTimeout: 10 * time.Second, timeout: 30 * time.Second,
		logger: testLogger(), workerLog: testLogger(), out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "payments check: OK")
}
