package amqpnames

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The names are a contract with operators (broker policies match them,
// dashboards name them): they are pinned here, spelt out.
func TestQueueNamesAreTheQueuesNameWithASuffix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orders.retry", RetryQueue("orders"))
	require.Equal(t, "orders.dlq", DeadLetterQueue("orders"))
	require.Equal(t, "orders.p7", PartitionQueue("orders", 7))
	require.Equal(t, "orders.p7.retry", RetryQueue(PartitionQueue("orders", 7)))
	require.Equal(t, "orders", PartitionExchange("orders"))
	require.Equal(t, "x-consistent-hash", PartitionExchangeType)
}

func TestQueuesListsWhatAConsumerDeclaresByDefault(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"orders", "orders.retry", "orders.dlq"}, Queues("orders", 0))
	require.Equal(t, []string{"orders.p0", "orders.p0.retry", "orders.p1", "orders.p1.retry", "orders.dlq"}, Queues("orders", 2))
}

// Only the names PartitionQueue makes are partitions: a redriven message's
// route is a publisher's header, and only a partition's name sends it
// straight to that partition.
func TestIsPartitionQueueKnowsOnlyThePartitionsOwnNames(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"orders.p0": true, "orders.p3": true, "orders.p1023": true,
		"orders": false, "orders.p": false, "orders.p3x": false, "orders.p-1": false, "orders.p03": false,
		"orders.p+3": false, "orders.p3.retry": false, "orders.dlq": false, "other.p3": false, "ordersp3": false,
	} {
		require.Equal(t, want, IsPartitionQueue("orders", name), name)
	}
}

// Every partition's name is one, and a name taken for a partition is the
// name PartitionQueue gives it.
func FuzzIsPartitionQueue(f *testing.F) {
	f.Add("orders", "orders.p3", uint16(3))
	f.Add("orders", "orders.p03", uint16(0))
	f.Add("", ".p0", uint16(9))
	f.Fuzz(func(t *testing.T, queue, name string, i uint16) {
		require.True(t, IsPartitionQueue(queue, PartitionQueue(queue, int(i))))
		if !IsPartitionQueue(queue, name) {
			return
		}
		n, err := strconv.Atoi(strings.TrimPrefix(name, queue+".p"))
		require.NoError(t, err)
		require.Equal(t, name, PartitionQueue(queue, n))
	})
}

func TestEveryHeaderOfIdemsIsUnderItsPrefix(t *testing.T) {
	t.Parallel()
	headers := []string{HeaderReason, HeaderError, HeaderConsumer, HeaderAttempts, HeaderAttempt, HeaderPayloadHash,
		HeaderMessageID, HeaderStoredHash, HeaderOriginalExchange, HeaderOriginalRoutingKey, HeaderPublishID,
		HeaderHistory, HeaderRedrivenAt, HeaderRedrivenBy, HeaderRedrivenFrom}
	seen := map[string]bool{}
	for _, h := range headers {
		require.True(t, strings.HasPrefix(h, HeaderPrefix), h)
		require.False(t, seen[h], "%s declared twice", h)
		seen[h] = true
	}
}
