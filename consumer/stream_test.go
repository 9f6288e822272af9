package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestMain(m *testing.M) {
	streamio.RouteClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

// streamEnv opens the stream protocol for a test.
func streamEnv(t *testing.T) *streamio.Env {
	t.Helper()
	env, err := streamio.Open(context.Background(), streamio.Config{URI: streamio.URLFromEnv()})
	if err != nil {
		testdb.Unavailable(t, "RabbitMQ stream port", err)
	}
	t.Cleanup(func() { _ = env.Close() })
	return env
}

// streamName is a stream name unique to the test, deleted when it ends.
func streamName(t *testing.T, env *streamio.Env) string {
	name := testdb.Name(t, "s")
	t.Cleanup(func() { _ = env.DeleteStream(context.Background(), name) })
	return name
}

// newStream declares a stream for the test and returns its name and a
// function that appends messages id-from … id-(to-1).
func newStream(t *testing.T) (string, func(from, to int)) {
	t.Helper()
	env := streamEnv(t)
	name := streamName(t, env)
	require.NoError(t, env.DeclareStream(context.Background(), name, streamio.StreamOptions{}))
	return name, streamPublisher(t, env, name)
}

// streamPublisher appends messages id-from … id-(to-1) to the stream name.
func streamPublisher(t *testing.T, env *streamio.Env, name string) func(from, to int) {
	return func(from, to int) {
		t.Helper()
		var out []streamio.Outgoing
		for i := from; i < to; i++ {
			out = append(out, streamio.Outgoing{MessageID: fmt.Sprintf("m-%d", i), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		}
		require.NoError(t, env.Publish(context.Background(), name, out))
	}
}

// streamConsumer is a consumer of the stream name with the test's small
// delays.
func (e *env) streamConsumer(name string, h Handler, edit func(*Config)) *Consumer {
	e.t.Helper()
	return e.newConsumer(h, func(cfg *Config) {
		cfg.Queue, cfg.Stream, cfg.Workers = "", name, 0
		if edit != nil {
			edit(cfg)
		}
	})
}

// checkpoint is the stream consumer "test"'s checkpoint in name, or -1.
func (e *env) checkpoint(name string) int64 {
	var last int64
	err := e.pool.QueryRow(context.Background(), `SELECT last_offset FROM `+e.tables.Table("checkpoints")+
		` WHERE consumer = 'test' AND stream = $1`, name).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1
	}
	require.NoError(e.t, err)
	return last
}

func TestStreamConsumerResumesAfterItsCheckpointAndAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream, publish := newStream(t)
	publish(0, 300)
	c := e.streamConsumer(stream, e.effectHandler(), nil)
	stop := start(t, c)
	waitFor(t, 30*time.Second, "checkpoint at 299", func() bool { return e.checkpoint(stream) == 299 })
	stop()

	publish(300, 400)
	publish(250, 300) // a producer that republished: same ids, same bodies
	c2 := e.streamConsumer(stream, e.effectHandler(), nil)
	start(t, c2)
	waitFor(t, 30*time.Second, "checkpoint at the new tail", func() bool { return e.checkpoint(stream) == 449 })
	eff := e.effects()
	require.Len(t, eff, 400)
	for id, n := range eff {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
	s := c2.Stats()
	require.EqualValues(t, 100, s.Processed, "the second run starts after the checkpoint")
	require.EqualValues(t, 50, s.Duplicates)
}

func TestStreamHandlerErrorRetriesInPlaceWithoutPassingTheCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream, publish := newStream(t)
	publish(0, 20)
	var fails atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-10" && fails.Add(1) <= 2 {
			return errors.New("not yet")
		}
		if m.ID == "m-15" {
			return Permanent(errors.New("never"))
		}
		return e.effectHandler()(ctx, tx, m)
	}
	c := e.streamConsumer(stream, h, func(cfg *Config) { cfg.RetryBaseDelay = 200 * time.Millisecond })
	start(t, c)
	waitFor(t, 10*time.Second, "first attempt failed", func() bool { return fails.Load() >= 1 })
	if fails.Load() < 3 {
		require.Less(t, e.checkpoint(stream), int64(10), "the checkpoint passed a message that was not settled")
		require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE stream_offset > 10`),
			"messages after the retried one must wait for it")
	}
	waitFor(t, 30*time.Second, "checkpoint at 19", func() bool { return e.checkpoint(stream) == 19 })
	eff := e.effects()
	require.Len(t, eff, 19)
	require.Equal(t, 1, eff["m-10"])
	require.NotContains(t, eff, "m-15")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+` WHERE message_id = 'm-15' AND reason = 'permanent'`))
}

func TestStreamStandbyTakesOverWhenTheActiveReaderStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream, publish := newStream(t)
	publish(0, 200)
	active := e.streamConsumer(stream, e.effectHandler(), nil)
	stopActive := start(t, active)
	waitFor(t, 30*time.Second, "active reader done", func() bool { return e.checkpoint(stream) == 199 })
	standby := e.streamConsumer(stream, e.effectHandler(), nil)
	start(t, standby)
	publish(200, 300)
	waitFor(t, 30*time.Second, "active reader took the new messages", func() bool { return e.checkpoint(stream) == 299 })
	require.Zero(t, standby.Stats().Processed, "the standby must not read while the active reader holds the lock")

	stopActive()
	publish(300, 400)
	// A batch is counted just after its transaction (and checkpoint)
	// commits.
	waitFor(t, 30*time.Second, "standby took over", func() bool {
		return e.checkpoint(stream) == 399 && standby.Stats().Processed == 100
	})
	eff := e.effects()
	require.Len(t, eff, 400)
	for id, n := range eff {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
}

func TestStreamReaderBacksOffFromScratchAfterAWorkingSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream, publish := newStream(t)
	c := e.streamConsumer(stream, e.effectHandler(), func(cfg *Config) { cfg.ReconnectMaxDelay = 20 * time.Second })
	start(t, c)
	publish(0, 10)
	waitFor(t, 20*time.Second, "first batch", func() bool { return e.checkpoint(stream) == 9 })
	// Cut the reader's database sessions again and again: each cut ends a
	// session that had committed, so the delay before reading again stays
	// short instead of doubling towards ReconnectMaxDelay.
	for round := 1; round <= 9; round++ {
		key := uint64(pglock.Key("idem/stream/" + e.tables.Schema + "/test/" + stream))
		waitFor(t, 10*time.Second, "the reader's lock session terminated", func() bool {
			var n int
			require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND classid::bigint = $1 AND objid::bigint = $2`,
				int64(key>>32), int64(key&0xffffffff)).Scan(&n))
			return n > 0
		})
		waitFor(t, 10*time.Second, "the reader noticed", func() bool { return c.Stats().Reconnects == int64(round) })
		from := 10 * round
		publish(from, from+10)
		waitFor(t, 3*time.Second, fmt.Sprintf("round %d read within a few seconds", round), func() bool {
			return e.checkpoint(stream) == int64(from+9)
		})
	}
}

// A session on a quiet stream commits nothing; once it lasted retry.Steady
// it worked all the same, so that a reader idle for days restarts after a
// short delay instead of the longest one.
func TestSessionWorkedIfItCommittedOrLastedSteady(t *testing.T) {
	require.True(t, sessionWorked(true, time.Millisecond), "a session that committed")
	require.True(t, sessionWorked(false, retry.Steady), "a quiet session that lasted")
	require.False(t, sessionWorked(false, retry.Steady-time.Second), "a short session that committed nothing")
}
