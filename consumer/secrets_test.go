package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

func TestBrokerPasswordNeverAppearsInLogsOrErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	var logs testrun.LogBuffer
	c, err := New(Config{
		Name: "secrets", Pool: pool, Queue: "q",
		// Two nodes, two passwords: each URL of a list is redacted.
		AMQPURLs:          []string{"amqp://user:s3cr3t-pa55@127.0.0.1:1/", "amqp://other:an0ther-pa55@127.0.0.1:2/"},
		Logger:            slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		ReconnectMaxDelay: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	c.Handle(func(context.Context, pgx.Tx, *Message) error { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	require.Contains(t, logs.String(), "broker unavailable", "the test must have logged connection failures")
	require.Contains(t, logs.String(), "127.0.0.1:2", "the test must have logged both nodes")
	require.NotContains(t, logs.String(), "s3cr3t-pa55")
	require.NotContains(t, logs.String(), "an0ther-pa55")

	err = c.Declare(context.Background())
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr3t-pa55")
	require.NotContains(t, err.Error(), "an0ther-pa55")
}
