//go:build cluster

package amqpnodes_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// A publisher given the cluster's nodes goes on through another node when
// its own is killed (kill -9) while it publishes: every message reaches
// the quorum queue, under the id it was published with.
func TestPublisherOutlivesAKilledNode(t *testing.T) {
	c := testcluster.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	q := testdb.Name(t, "pubkill")
	t.Cleanup(func() { c.DeleteQueues(t, q) })
	declareQuorumQueue(ctx, t, c.AMQPURLs, q)

	pub, err := amqpnodes.NewPublisher(ctx, c.AMQPURLs)
	require.NoError(t, err)
	defer pub.Close()
	node := publisherNode(t, c)

	const n = 6000
	killed := make(chan struct{})
	for i := range n {
		if i == 1000 {
			go func() { // owned by the test: ends once the node is gone
				defer close(killed)
				c.Kill(t, node)
			}()
		}
		require.NoError(t, pub.Publish(ctx, "", q, amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), Body: []byte(`1`)}))
		if i == n/2 {
			<-killed // the rest is published after the node is gone
		}
	}
	require.NoError(t, pub.Flush(ctx))
	require.NotEqual(t, node, publisherNode(t, c), "published through another node")
	require.Len(t, drain(ctx, t, c.AMQPURLs, q, n), n, "every id stored")
}

// publisherNode returns the node the (one) amqpnodes.Publisher is connected
// to, waiting until the cluster lists it.
func publisherNode(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	var node string
	testrun.WaitFor(t, 30*time.Second, "the publisher's connection listed", func() bool {
		for _, conn := range c.Connections(t) {
			if conn.ClientName == amqpnodes.PublisherConnectionName {
				node = conn.Node
				return true
			}
		}
		return false
	})
	return node
}

// declareQuorumQueue declares the quorum queue q through any node.
func declareQuorumQueue(ctx context.Context, t *testing.T, urls []string, q string) {
	t.Helper()
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
}

// drain consumes q until it holds no more message for a few seconds, or
// until want distinct ids came, and returns the ids it read.
func drain(ctx context.Context, t *testing.T, urls []string, q string, want int) map[string]bool {
	t.Helper()
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(1000, 0, false))
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	require.NoError(t, err)
	ids := map[string]bool{}
	for len(ids) < want {
		select {
		case d, ok := <-deliveries:
			require.True(t, ok, "the drain's channel closed")
			ids[d.MessageId] = true
		case <-time.After(10 * time.Second):
			return ids
		case <-ctx.Done():
			return ids
		}
	}
	return ids
}
