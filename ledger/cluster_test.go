//go:build cluster

package ledger_test

import (
	"context"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/ledger"
)

// The outbox given every node of a cluster publishes through another node
// once the one it uses is killed: the effect recorded after the kill
// succeeds, into the same quorum queue, and nothing published before is
// lost.
func TestOutboxPublishesThroughAnotherNodeWhenItsNodeIsKilled(t *testing.T) {
	c := testcluster.Require(t)
	f := newFixture(t)
	q := testdb.Name(t, "q")
	t.Cleanup(func() { c.DeleteQueues(t, q) })
	conn, _, err := amqpnodes.Dial(context.Background(), c.AMQPURLs, amqp.Config{})
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	require.NoError(t, conn.Close())

	ex, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URLs: c.AMQPURLs, ConnectionName: "idem:" + q})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"evt": ex}})

	a := f.record(t, context.Background(), ledger.Effect{Type: "evt", BusinessKey: "a", Request: ledger.Publishing{RoutingKey: q, Body: []byte(`1`)}})[0]
	f.waitFor(t, a.ID, status(ledger.StatusSucceeded))
	var node string
	testrun.WaitFor(t, 10*time.Second, "the outbox's connection listed", func() bool {
		for _, conn := range c.Connections(t) {
			if conn.ClientName == "idem:"+q {
				node = conn.Node
				return true
			}
		}
		return false
	})
	c.Kill(t, node)
	b := f.record(t, context.Background(), ledger.Effect{Type: "evt", BusinessKey: "b", Request: ledger.Publishing{RoutingKey: q, Body: []byte(`2`)}})[0]
	f.waitFor(t, b.ID, status(ledger.StatusSucceeded))

	others := slices.DeleteFunc(slices.Clone(c.AMQPURLs), func(u string) bool { return u == c.URL(t, node) })
	conn, _, err = amqpnodes.Dial(context.Background(), others, amqp.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err = conn.Channel()
	require.NoError(t, err)
	got := messageIDs(t, ch, q, 2)
	require.Subset(t, got, []string{a.ID, b.ID}, "both effects published (an unknown outcome may publish one twice, with its id)")
}
