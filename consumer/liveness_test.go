package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// A handler that hangs in a statement (context-aware) or in Go code that
// ignores its context must not stall the worker: its message is retried,
// then dead-lettered with reason handler_timeout, while every other message
// of its batches commits once; the abandoned handler is counted.
func TestHungHandlersTimeOutAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		hang      func(ctx context.Context, tx pgx.Tx) error
		abandoned bool
	}{
		{"statement", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT pg_sleep(3600)")
			return err
		}, false},
		{"ignores its context", func(ctx context.Context, tx pgx.Tx) error {
			time.Sleep(4 * time.Second) // never looks at ctx
			return nil
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declare(nil)
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if m.ID == "hang" {
					return tc.hang(ctx, tx)
				}
				return e.effectHandler()(ctx, tx, m)
			}
			c := e.newConsumer(h, func(cfg *Config) {
				cfg.HandlerTimeout = 300 * time.Millisecond
				cfg.MaxAttempts = 2
				cfg.Workers = 1
			})
			for i := range 20 {
				e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
				if i == 5 {
					e.publish("hang", `{}`, nil)
				}
			}
			start(t, c)
			waitFor(t, 60*time.Second, "every message settled", func() bool { return settled(c) == 21 })
			eff := e.effects()
			require.Len(t, eff, 20)
			for id, n := range eff {
				require.Equal(t, 1, n, "message %s applied %d times", id, n)
			}
			dlq := e.drain(e.queue + ".dlq")
			require.Len(t, dlq, 1)
			require.Equal(t, "hang", dlq[0].MessageId)
			require.Equal(t, deadletters.ReasonHandlerTimeout, dlq[0].Headers["x-idem-reason"])
			require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+
				` WHERE message_id = 'hang' AND reason = 'handler_timeout'`))
			if tc.abandoned {
				require.EqualValues(t, 2, c.Stats().AbandonedHandlers, "one per attempt")
			}
		})
	}
}

// A handler that ignores its context holds its message's inbox row lock in
// an open transaction; the timeout must terminate the abandoned handler's
// backend, so that the message's retry is not blocked behind it and no
// backend keeps a lock on the inbox.
func TestTimedOutHandlerReleasesItsLocksForOtherWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var first atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-lock" && first.CompareAndSwap(false, true) {
			time.Sleep(time.Hour) // ignores its context: abandoned
		}
		return e.effectHandler()(ctx, tx, m)
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.HandlerTimeout = 200 * time.Millisecond; cfg.Workers = 1 })
	e.publish("m-lock", `{}`, nil)
	start(t, c)
	waitFor(t, 30*time.Second, "m-lock processed on its retry", func() bool { return e.effects()["m-lock"] == 1 })
	require.EqualValues(t, 1, c.Stats().AbandonedHandlers)
	require.Zero(t, e.count(`SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND pid <> pg_backend_pid()`,
		e.tables.Table("inbox")), "a backend still holds a lock on this test's inbox")
}

// Raw transaction control in a handler would silently break exactly-once:
// a ROLLBACK loses the batch's inbox rows, a COMMIT commits them before the
// batch is done. It is refused, the message is dead-lettered with reason
// handler_ended_transaction, and every other message applies exactly once.
func TestRawTransactionControlInAHandlerIsRefusedAndDeadLettered(t *testing.T) {
	t.Parallel()
	for _, stmt := range []string{"COMMIT", "ROLLBACK", "ROLLBACK TO SAVEPOINT idem_message", "UPDATE pg_class SET relname = relname WHERE false; COMMIT"} {
		t.Run(stmt, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.declare(nil)
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if err := e.effectHandler()(ctx, tx, m); err != nil {
					return err
				}
				if m.ID == "rogue" {
					_, _ = tx.Exec(ctx, stmt) // the error is swallowed: the runtime must still notice
				}
				return nil
			}
			c := e.newConsumer(h, func(cfg *Config) { cfg.Workers = 1; cfg.BatchMaxWait = 50 * time.Millisecond })
			for i := range 10 {
				e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
				if i == 4 {
					e.publish("rogue", `{}`, nil)
				}
			}
			start(t, c)
			waitFor(t, 30*time.Second, "every message settled", func() bool { return settled(c) == 11 })
			eff := e.effects()
			require.NotContains(t, eff, "rogue", "the rogue handler's writes never commit")
			require.Len(t, eff, 10)
			for id, n := range eff {
				require.Equal(t, 1, n, "message %s applied %d times", id, n)
			}
			require.Equal(t, 10, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")))
			require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+
				` WHERE message_id = 'rogue' AND reason = 'handler_ended_transaction'`))
		})
	}
}

// A handler that ends the transaction through the raw connection, past the
// guard, is caught by the transaction status check: nothing of its batch is
// acked as processed without its inbox row.
func TestHandlerThatCommitsThroughTheRawConnectionFailsLoudly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := e.effectHandler()(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "rogue" {
			_, err := tx.Conn().Exec(ctx, "COMMIT")
			return err
		}
		return nil
	}, nil)
	out, err := c.Process(context.Background(), []Message{
		{MessageID: "a", Body: []byte(`1`)}, {MessageID: "rogue", Body: []byte(`2`)}, {MessageID: "b", Body: []byte(`3`)},
	})
	require.NoError(t, err)
	require.Equal(t, []idem.Outcome{idem.Duplicate, idem.DeadLettered, idem.Processed}, []idem.Outcome{out[0].Outcome, out[1].Outcome, out[2].Outcome},
		"a was committed by the rogue COMMIT with its inbox row: a duplicate now, applied once")
	require.Equal(t, deadletters.ReasonHandlerEndedTx, out[1].Reason)
	require.Equal(t, map[string]int{"a": 1, "rogue": 1, "b": 1}, e.effects(),
		"the rogue's writes before its own COMMIT are the handler's fault; nothing is applied twice")
}

// Publisher-supplied x-idem-* headers steer nothing: an attempt count of 99
// does not dead-letter a message on its first transient failure, and a
// spoofed original route is not what the dead-letter row records.
func TestPublisherHeadersNeverSetAttemptsOrRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var attempts []int
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "spoofed" {
			attempts = append(attempts, m.Attempt)
			if len(attempts) <= 2 { // the optimistic run and its savepoint rerun
				return errors.New("transient")
			}
			return e.effectHandler()(ctx, tx, m)
		}
		return Permanent(errors.New("rejected"))
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.Workers = 1 })
	spoof := amqp.Table{"x-idem-attempt": int64(99), "x-idem-original-exchange": "spoofed-exchange",
		"x-idem-original-routing-key": "spoofed-key",
		"x-death":                     []any{amqp.Table{"queue": e.queue + ".retry", "reason": "expired", "count": int64(50)}}}
	e.publish("spoofed", `{}`, spoof)
	e.publish("rejected", `{}`, spoof)
	start(t, c)
	waitFor(t, 30*time.Second, "both settled", func() bool { return settled(c) == 2 })
	require.Equal(t, []int{1, 1, 2}, attempts, "attempts come from the runtime's own table, not from headers")
	require.Equal(t, 1, e.effects()["spoofed"])
	var exchange, key string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT exchange, routing_key FROM `+
		e.tables.Table("dead_letters")+` WHERE message_id = 'rejected'`).Scan(&exchange, &key))
	require.Equal(t, [2]string{"", e.queue}, [2]string{exchange, key}, "the route the broker delivered, not the spoofed one")
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("attempts")), "settled messages leave no attempts rows")
}

// A broker session that dies while handlers run cancels them: a handler
// waiting on its context (for, say, a slow downstream) returns at once,
// its batch is not committed, the worker reconnects and the redelivered
// message is processed once.
func TestDeadSessionCancelsItsHandlersAndTheWorkerReconnects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	proxy := testbroker.NewProxy(t)
	var blocked, cancelled atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if blocked.Add(1) == 1 {
			<-ctx.Done() // the session's death must end this wait, long before HandlerTimeout
			cancelled.Add(1)
			return ctx.Err()
		}
		return e.effectHandler()(ctx, tx, m)
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.AMQPURL = proxy.URL(); cfg.HandlerTimeout = time.Hour })
	e.publish("m", `{}`, nil)
	start(t, c)
	waitFor(t, 10*time.Second, "the handler is waiting", func() bool { return blocked.Load() == 1 })
	proxy.Sever()
	waitFor(t, 10*time.Second, "the handler was cancelled", func() bool { return cancelled.Load() == 1 })
	waitFor(t, 30*time.Second, "processed after the reconnect", func() bool { return e.effects()["m"] == 1 })
	require.GreaterOrEqual(t, c.Stats().Reconnects, int64(1))
}

// Shutdown does not wait for a handler that ignores its context beyond the
// handler timeout: Run returns, and the message goes back to the queue.
func TestRunReturnsOnShutdownWhileAHandlerIgnoresItsContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var running atomic.Bool
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		running.Store(true)
		time.Sleep(time.Hour)
		return nil
	}, func(cfg *Config) { cfg.HandlerTimeout = 500 * time.Millisecond; cfg.ShutdownTimeout = time.Hour })
	e.publish("m", `{}`, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 10*time.Second, "the handler runs", running.Load)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return: a handler that ignores its context stalled shutdown")
	}
}

// Dead-letter rows of messages without a usable id carry something an
// operator can search by: the cleaned id, or the payload hash.
func TestDeadLettersWithoutAnIdAreFoundByTheirPayloadHash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), nil)
	out, err := c.Process(context.Background(), []Message{{Body: []byte(`no id`)}, {MessageID: "bad-\xff-id", Body: []byte(`x`)}})
	require.NoError(t, err)
	require.Equal(t, idem.DeadLettered, out[0].Outcome)
	ids := map[string]bool{}
	rows, err := e.pool.Query(context.Background(), `SELECT message_id FROM `+e.tables.Table("dead_letters"))
	require.NoError(t, err)
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { ids[id] = true; return nil })
	require.NoError(t, err)
	require.True(t, ids["sha256:"+out[0].Message.Hash.String()], "rows: %v", ids)
	require.True(t, ids["bad-\uFFFD-id"], "rows: %v", ids)
}

// A batch handler abandoned past its deadline may still read its messages
// while the batch runs again message by message: the runtime must not write
// to those messages meanwhile (the race detector watches).
func TestAbandonedBatchHandlerDoesNotRaceTheRerun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stop := make(chan struct{})
	defer close(stop)
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.HandlerTimeout = 100 * time.Millisecond })
	c.HandleBatch(func(ctx context.Context, tx pgx.Tx, ms []*Message) error {
		for { // ignores its context, reading its messages
			select {
			case <-stop:
				return nil
			default:
			}
			for _, m := range ms {
				_, _ = m.Attempt, m.RoutingKey
			}
			time.Sleep(time.Millisecond)
		}
	})
	out, err := c.Process(context.Background(), []Message{{MessageID: "a", Body: []byte("1")}, {MessageID: "b", Body: []byte("2")}})
	require.NoError(t, err)
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed}, []idem.Outcome{out[0].Outcome, out[1].Outcome})
	require.Equal(t, map[string]int{"a": 1, "b": 1}, e.effects())
}

// A handler's context has a deadline HandlerTimeout after the handler
// started, and when that passes it ends with context.DeadlineExceeded, as
// one from context.WithTimeout would. The message whose handler ran out is
// retried; the other handlers of its batch see live contexts, in the batch
// that runs again without it.
func TestHandlerContextHasItsDeadlineAndEndsWithDeadlineExceeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, tables := testdb.Schema(t)
	const timeout = 300 * time.Millisecond
	c, err := New(Config{Name: "deadline", Pool: pool, Tables: tables, Logger: testLogger(), HandlerTimeout: timeout})
	require.NoError(t, err)
	type seen struct {
		left     time.Duration // deadline minus start
		err      error         // ctx.Err() when the handler returned
		doneErr  error         // ctx.Err() once done, for the waiting handler
		deadline bool
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		start := time.Now()
		d, ok := ctx.Deadline()
		s := seen{left: d.Sub(start), deadline: ok}
		if m.ID == "waits" {
			<-ctx.Done()
			s.doneErr = ctx.Err()
		}
		s.err = ctx.Err()
		mu.Lock()
		got[m.ID] = append(got[m.ID], s)
		mu.Unlock()
		return s.err
	})
	out, err := c.Process(ctx, []Message{{MessageID: "before", Body: []byte("{}")},
		{MessageID: "waits", Body: []byte("{}")}, {MessageID: "after", Body: []byte("{}")}})
	require.NoError(t, err)
	require.Equal(t, []string{"processed", "retried", "processed"},
		[]string{out[0].Outcome.String(), out[1].Outcome.String(), out[2].Outcome.String()})
	require.ErrorIs(t, out[1].Err, context.DeadlineExceeded)
	require.ErrorContains(t, out[1].Err, "deadline")

	mu.Lock()
	defer mu.Unlock()
	for id, runs := range got {
		for _, s := range runs {
			require.True(t, s.deadline, "%s: a handler context has a deadline", id)
			require.InDelta(t, timeout, s.left, float64(50*time.Millisecond), "%s: the deadline is HandlerTimeout after the handler started", id)
			if id != "waits" {
				require.NoError(t, s.err, "%s: a handler that did not run out sees a live context", id)
			}
		}
	}
	require.Len(t, got["waits"], 1)
	require.ErrorIs(t, got["waits"][0].doneErr, context.DeadlineExceeded)
	require.Len(t, got["after"], 1, "the handlers after the one that ran out ran in the batch that ran again")
}
