package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// A stream consumer started before anything declared its stream declares
// it (Topology Declare, the default) and reads what is published next,
// at once, instead of waiting for someone else to declare it; Declare does
// the same without running.
func TestAStreamConsumerDeclaresItsStreamByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	env := streamEnv(t)
	ctx := context.Background()
	name := streamName(t, env)
	c := e.streamConsumer(name, e.effectHandler(), nil)
	start(t, c)
	waitFor(t, 10*time.Second, "the consumer declared its stream", func() bool {
		ok, err := env.StreamExists(ctx, name)
		return err == nil && ok
	})
	_, err := e.ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
	require.NoError(t, err, "a publisher that declares the stream over AMQP 0-9-1 finds it as it would declare it")
	streamPublisher(t, env, name)(0, 10)
	waitFor(t, 10*time.Second, "the messages published after the declaration applied", func() bool {
		return e.checkpoint(name) == 9
	})
	require.Len(t, e.effects(), 10)
	// Ready once the database probe's first check, over connections of its
	// own, has answered.
	waitFor(t, 10*time.Second, "the consumer ready", func() bool { return c.Health().Ready })

	other := streamName(t, env)
	require.NoError(t, e.streamConsumer(other, e.effectHandler(), nil).Declare(ctx))
	ok, err := env.StreamExists(ctx, other)
	require.NoError(t, err)
	require.True(t, ok, "Declare declares the stream")
	require.NoError(t, e.streamConsumer(other, e.effectHandler(), nil).Declare(ctx), "declaring again is no error")
}

// A consumer told not to declare its stream (Passive, Existing) fails fast
// when the stream does not exist, with an error that names the stream and
// says how to declare it, instead of waiting for it with a growing backoff.
func TestAStreamConsumerThatDoesNotDeclareFailsFastOnAMissingStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	env := streamEnv(t)
	name := streamName(t, env)
	for _, topology := range []Topology{Passive, Existing} {
		c := e.streamConsumer(name, e.effectHandler(), func(cfg *Config) { cfg.Topology = topology })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := c.Run(ctx)
		cancel()
		require.Error(t, err, "topology %d: Run returned nil: it waited for the stream until its context ended", topology)
		require.ErrorContains(t, err, "stream "+name+" does not exist")
		require.ErrorContains(t, err, "Topology at Declare")
		require.False(t, c.Health().Live, "a consumer whose Run failed is not live")
	}
	c := e.streamConsumer(name, e.effectHandler(), func(cfg *Config) { cfg.Topology = Passive })
	require.ErrorContains(t, c.Declare(context.Background()), "stream "+name+" does not exist")
	ok, err := env.StreamExists(context.Background(), name)
	require.NoError(t, err)
	require.False(t, ok, "nothing declared the stream")
}

// A stream declared with other arguments than the consumer's (a
// retention; or through the stream protocol, whose declaration adds a
// leader locator) is read as it is: none of them changes what idem
// guarantees. A queue of another type by the stream's name is refused,
// with an error that names it, as a queue with other arguments is.
func TestAStreamDeclaredOtherwiseIsReadAsItIsAndAQueueByItsNameIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	env := streamEnv(t)
	ctx := context.Background()
	retained := streamName(t, env)
	require.NoError(t, env.DeclareStream(ctx, retained, streamio.StreamOptions{MaxAge: time.Hour}))
	plain := streamName(t, env)
	require.NoError(t, env.DeclareStream(ctx, plain, streamio.StreamOptions{}))
	for i, name := range []string{retained, plain} {
		streamPublisher(t, env, name)(0, 5)
		c := e.streamConsumer(name, e.effectHandler(), func(cfg *Config) { cfg.Name = fmt.Sprint("test-", i) })
		start(t, c)
		waitFor(t, 10*time.Second, name+" read", func() bool { return c.Stats().Processed == 5 })
	}

	classic := testbroker.Queue(t)
	_, err := e.ch.QueueDeclare(classic, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	require.NoError(t, err)
	c := e.streamConsumer(classic, e.effectHandler(), nil)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = c.Run(rctx)
	require.ErrorContains(t, err, "stream "+classic+": a queue of another type has the name")
	require.ErrorContains(t, c.Declare(ctx), "a queue of another type has the name")
}

// A consumer that has read its stream (it holds a checkpoint) does not
// declare it again once it is gone: a new stream's offsets start at 0, and
// reading it from after the checkpoint would skip its first records. Run
// ends, saying the stream was deleted and what to do.
func TestADeletedStreamIsNotDeclaredAgainOverItsCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	env := streamEnv(t)
	ctx := context.Background()
	name := streamName(t, env)
	require.NoError(t, env.DeclareStream(ctx, name, streamio.StreamOptions{}))
	streamPublisher(t, env, name)(0, 3)
	stop := start(t, e.streamConsumer(name, e.effectHandler(), nil))
	waitFor(t, 20*time.Second, "checkpoint at 2", func() bool { return e.checkpoint(name) == 2 })
	stop()
	require.NoError(t, env.DeleteStream(ctx, name))

	c := e.streamConsumer(name, e.effectHandler(), nil)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := c.Run(rctx)
	require.ErrorContains(t, err, "it was deleted")
	require.ErrorContains(t, err, "read it up to offset 2")
	ok, err := env.StreamExists(ctx, name)
	require.NoError(t, err)
	require.False(t, ok, "the consumer did not declare it again")
}

// A stream deleted and declared again behind a consumer's back holds fewer
// records than its checkpoint: the consumer does not wait silently for the
// offset after its checkpoint (skipping the new stream's first records), it
// reports the trouble and applies nothing.
func TestARecreatedStreamIsNotReadFromAfterTheOldCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	env := streamEnv(t)
	ctx := context.Background()
	name := streamName(t, env)
	require.NoError(t, env.DeclareStream(ctx, name, streamio.StreamOptions{}))
	streamPublisher(t, env, name)(0, 5)
	stop := start(t, e.streamConsumer(name, e.effectHandler(), nil))
	waitFor(t, 20*time.Second, "checkpoint at 4", func() bool { return e.checkpoint(name) == 4 })
	stop()
	require.NoError(t, env.DeleteStream(ctx, name))
	require.NoError(t, env.DeclareStream(ctx, name, streamio.StreamOptions{}))
	streamPublisher(t, env, name)(100, 102) // offsets 0 and 1 of the new stream

	c := e.streamConsumer(name, e.effectHandler(), nil)
	start(t, c)
	waitFor(t, 20*time.Second, "the trouble reported", func() bool {
		return strings.Contains(c.Health().Reason, "declared again")
	})
	require.Len(t, e.effects(), 5, "nothing of the new stream applied past the old checkpoint")
	require.Equal(t, int64(4), e.checkpoint(name))
}
