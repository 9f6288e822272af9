package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

func TestSenderPublishesAgainWhatItsLostConnectionLeftUnconfirmed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch := testbroker.Channel(t)
	queue := testbroker.Queue(t)
	_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)

	proxy := testbroker.NewProxy(t)
	var mu sync.Mutex
	var logs []string
	s := &sender{
		// A node that is down first: the list is walked.
		urls: []string{"amqp://guest:guest@127.0.0.1:1/", proxy.URL()},
		name: "idem-soak-test",
		logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, fmt.Sprintf(format, args...))
		},
	}
	require.NoError(t, s.dial(ctx))
	defer s.close()

	// The connection stops passing bytes: nothing published reaches the
	// broker, nor any confirm the sender; then it is cut.
	proxy.StallOpen()
	for i := range 20 {
		require.NoError(t, s.publish(ctx, i, queue, amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte("{}")}))
	}
	proxy.Sever()
	done, err := s.flush(ctx)
	require.NoError(t, err)
	require.Len(t, done, 20, "every message confirmed, on the next connection")
	for i, d := range done {
		require.Equal(t, i, d, "in publishing order")
	}
	mu.Lock()
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], "publishing its 20 unconfirmed messages again")
	require.False(t, strings.Contains(logs[0], "guest:guest"), "URLs logged redacted: %s", logs[0])
	mu.Unlock()

	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 20, q.Messages, "each message once: the stalled copies never reached the broker")
}
