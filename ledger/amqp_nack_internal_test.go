package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// A nacked publish is retryable, and the next one goes through a new
// connection: after a quorum queue's leader election a connection may go on
// being nacked where a new one is not.
func TestOutboxPublishesThroughANewConnectionAfterANack(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.FullQueue(t, ch) // the broker nacks the second publish
	ex, err := NewAMQPExecutor(AMQPConfig{URL: testbroker.URL()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ex.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	res, err := ex.Execute(ctx, publishCall(t, "e1", q, []byte(`1`)))
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, res.Status)
	first := ex.sess
	res, err = ex.Execute(ctx, publishCall(t, "e2", q, []byte(`2`)))
	require.ErrorContains(t, err, "nacked")
	require.Equal(t, StatusFailedRetryable, res.Status)
	require.Same(t, first, ex.sess, "the nacked publish went through the first connection")

	_, err = ch.QueuePurge(q, false)
	require.NoError(t, err)
	res, err = ex.Execute(ctx, publishCall(t, "e2", q, []byte(`2`)))
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, res.Status)
	require.NotSame(t, first, ex.sess, "the publish after the nack dialled a new connection")
	require.Eventually(t, first.conn.IsClosed, 5*time.Second, 10*time.Millisecond, "the nacked connection is closed")
}
