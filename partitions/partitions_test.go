package partitions

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRouteSendsToTheExchangeByKeyOnlyWhenPartitioned(t *testing.T) {
	ex, rk := Route("orders", 8, "account-17")
	require.Equal(t, "orders", ex)
	require.Equal(t, "account-17", rk)
	ex, rk = Route("orders", 0, "account-17")
	require.Equal(t, "", ex)
	require.Equal(t, "orders", rk)
	require.Equal(t, "orders.p7", QueueName("orders", 7))
}
