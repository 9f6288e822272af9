package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// AMQP 0-9-1 methods at which the broker goes deaf to Redrive.
type method struct{ class, id uint16 }

var (
	basicGet     = method{60, 70}
	basicPublish = method{60, 40}
)

// redriveThroughDeafBroker puts one message, m-1, in the dead-letter queue
// and runs Redrive on ctx through a proxy to the broker that forwards what
// Redrive sends until it sends m; from then on nothing more Redrive sends
// reaches the broker, while the broker's frames (heartbeats) still reach
// Redrive. That is RabbitMQ during a memory or disk alarm, as the client
// sees it: the connection stays up and nothing is ever answered. It returns
// once the proxy stopped forwarding, and where Redrive's error will come.
func (e *env) redriveThroughDeafBroker(ctx context.Context, m method, brokerTimeout time.Duration) <-chan error {
	e.t.Helper()
	e.declare(nil)
	e.deadLetter("billing", "m-1", "max_attempts")
	proxy := testbroker.NewProxy(e.t, testbroker.DeafAtMethod(faultproxy.Client, m.class, m.id))
	o := e.options()
	o.AMQPURL = proxy.URL()
	if brokerTimeout > 0 {
		deadletters.SetBrokerTimeout(&o, brokerTimeout)
	}
	done := make(chan error, 1)
	go func() {
		_, err := deadletters.Redrive(ctx, o)
		done <- err
	}()
	select {
	case <-proxy.Stalled():
	case err := <-done:
		e.t.Fatalf("Redrive returned before the broker stalled: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("the proxy never saw the method it stalls at")
	}
	return done
}

// dlqHolds waits until the dead-letter queue holds want messages again
// (they return to it when the redrive connection is gone) and checks them.
func (e *env) dlqHolds(want ...string) {
	e.t.Helper()
	e.holds(e.queue+".dlq", len(want)) // the unacked messages return to the dead-letter queue
	require.Equal(e.t, want, ids(e.drain(e.queue+".dlq")))
	require.Empty(e.t, e.redriven(), "and no row is marked")
}

// returnsWithin bounds how long Redrive may take once cancelled or once its
// broker call timed out: without the bounds it waits for the broker's
// heartbeat timeout (tens of seconds), or for good.
const returnsWithin = 5 * time.Second

func TestRedriveReturnsWhenCancelledWhileTheBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	for name, m := range map[string]method{"get": basicGet, "publish": basicPublish} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := e.redriveThroughDeafBroker(ctx, m, 0)
			time.Sleep(100 * time.Millisecond) // Redrive waits on the broker now
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(returnsWithin):
				t.Fatalf("Redrive still runs %s after its context was cancelled", returnsWithin)
			}
			e.dlqHolds("m-1")
			require.Empty(t, e.drain(e.queue), "the stalled publish never reached the queue")
		})
	}
}

func TestRedriveGivesUpOnABrokerThatStopsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	start := time.Now()
	err := <-e.redriveThroughDeafBroker(context.Background(), basicGet, time.Second)
	require.ErrorContains(t, err, "no answer from the broker within 1s")
	require.Less(t, time.Since(start), returnsWithin)
	e.dlqHolds("m-1")
}
