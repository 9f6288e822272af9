package deadletters

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// A partitioned consumer's dead letter goes back through the exchange by
// the routing key it was delivered with, unless that route names one of
// the consumer's partitions (it came from that partition's retry queue):
// then straight to that partition.
func TestRedriveRoutesAPartitionedDeadLetterToItsKeysPartition(t *testing.T) {
	r := &redrive{o: RedriveOptions{Queue: "orders", DeadLetterQueue: "orders.dlq"}, exchange: "orders"}
	at := func(key, id string) taken {
		return taken{move: true, d: amqp.Delivery{MessageId: id, Headers: amqp.Table{HeaderOriginalRoutingKey: key}}}
	}
	route := func(t taken) [2]string { ex, key := r.route(t); return [2]string{ex, key} }
	require.Equal(t, [2]string{"orders", "acct-7"}, route(at("acct-7", "m-1")))
	require.Equal(t, [2]string{"", "orders.p3"}, route(at("orders.p3", "m-2")))
	require.Equal(t, [2]string{"orders", "orders.p3x"}, route(at("orders.p3x", "m-3")))
	require.Equal(t, [2]string{"orders", "orders.p"}, route(at("orders.p", "m-4")))
	require.Equal(t, [2]string{"orders", "m-5"}, route(at("", "m-5")), "no route: by message id")
	require.Equal(t, [2]string{"", "orders.dlq"}, route(taken{move: false}))
}
