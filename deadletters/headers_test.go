package deadletters

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestASecondRedriveAppendsToTheHistoryNewestLast(t *testing.T) {
	t.Parallel()
	t1, t2 := time.Unix(1700000000, 0), time.Unix(1700003600, 0)
	first := redriveHeaders(amqp.Table{"x-idem-reason": "max_attempts", "x-idem-attempt": int64(5), "tenant": "t-1",
		"x-delivery-count": int64(4)}, t1, "alice", "q.dlq")
	require.Equal(t, amqp.Table{"tenant": "t-1", HistoryHeader: []any{amqp.Table{
		"x-idem-reason": "max_attempts", "x-idem-attempt": int64(5),
		HistoryRedrivenAt: t1.UTC(), HistoryRedrivenBy: "alice", HistoryRedrivenFrom: "q.dlq",
	}}}, first, "the broker's delivery counter is dropped, idem's headers move")

	// Dead-lettered again, by the broker this time, then redriven again.
	again := amqp.Table{}
	for k, v := range first {
		again[k] = v
	}
	again["x-death"] = []any{amqp.Table{"reason": "delivery_limit", "queue": "q"}}
	again["x-first-death-reason"] = "delivery_limit"
	require.Equal(t, "delivery_limit", identify(amqp.Delivery{Headers: again}, "q", "").reason)
	second := redriveHeaders(again, t2, "", "q.dlq")
	history := second[HistoryHeader].([]any)
	require.Len(t, history, 2)
	require.Equal(t, first[HistoryHeader].([]any)[0], history[0])
	require.Equal(t, "delivery_limit", history[1].(amqp.Table)["x-first-death-reason"])
	require.Contains(t, history[1].(amqp.Table), "x-death")
	require.Equal(t, t2.UTC(), history[1].(amqp.Table)[HistoryRedrivenAt])
	require.NotContains(t, second, "x-death")
	require.Equal(t, "t-1", second["tenant"])
}
