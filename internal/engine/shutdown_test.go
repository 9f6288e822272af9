package engine

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A batch whose context ends (a Ctrl-C, a shutdown) is not retried, and
// saying so at WARN would send an operator looking for a failure.
func TestABatchStoppedByShutdownIsNotLoggedAsARetry(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	started := make(chan struct{})
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []Result, 1)
	go func() { done <- f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{}) }()
	<-started
	cancel()
	select {
	case res := <-done:
		require.Equal(t, []idem.Outcome{idem.Unresolved}, outcomes(res))
	case <-time.After(30 * time.Second):
		t.Fatal("the batch did not stop after its context ended")
	}
	require.NotContains(t, logs.String(), "level=WARN", logs.String())
	require.Zero(t, f.balance(1))
}
