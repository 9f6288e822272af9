package consumer

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// Only the broker's redelivered flag makes a delivery suspect (run alone):
// a publisher that sets x-delivery-count on a first delivery steers nothing.
func TestOnlyTheBrokersRedeliveredFlagMakesADeliverySuspect(t *testing.T) {
	require.False(t, isSuspect(&amqp.Delivery{Headers: amqp.Table{"x-delivery-count": int64(1)}}))
	require.False(t, isSuspect(&amqp.Delivery{Headers: amqp.Table{"x-delivery-count": "7"}}))
	require.True(t, isSuspect(&amqp.Delivery{Redelivered: true}))
	require.True(t, isSuspect(&amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int64(2)}}))
}
