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
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

func TestSameMessageDeliveredFiveTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	for i := 0; i < 5; i++ {
		e.publish("m-1", `{"n":1}`, nil)
	}
	c := e.newConsumer(e.effectHandler(), nil)
	start(t, c)
	waitFor(t, 20*time.Second, "5 deliveries settled", func() bool { return settled(c) == 5 })
	require.Equal(t, map[string]int{"m-1": 1}, e.effects())
	s := c.Stats()
	require.EqualValues(t, 1, s.Processed)
	require.EqualValues(t, 4, s.Duplicates)
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")))
}

func TestDuplicatesRacingAcrossFourWorkersApplyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	const ids, copies = 200, 4
	for c := 0; c < copies; c++ {
		for i := 0; i < ids; i++ {
			e.publish(fmt.Sprintf("m-%d", i), fmt.Sprintf(`{"n":%d}`, i), nil)
		}
	}
	var consumers []*Consumer
	for w := 0; w < 4; w++ {
		c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.Prefetch = 50; cfg.BatchMaxSize = 20 })
		start(t, c)
		consumers = append(consumers, c)
	}
	waitFor(t, 60*time.Second, "every copy settled", func() bool {
		var n int64
		for _, c := range consumers {
			n += settled(c)
		}
		return n == ids*copies
	})
	eff := e.effects()
	require.Len(t, eff, ids)
	for id, n := range eff {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
}

func TestCrashBetweenCommitAndAckRedeliversAsDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testbroker.NewProxy(t)
	e.declare(nil)
	e.publish("m-1", `{"n":1}`, nil)
	cfg := e.config()
	cfg.AMQPURL = proxy.URL()
	var severed atomic.Bool
	c, err := build(cfg, func() {
		// The connection dies after the commit and before the ack.
		if severed.CompareAndSwap(false, true) {
			proxy.Sever()
			time.Sleep(100 * time.Millisecond) // let the client notice
		}
	})
	require.NoError(t, err)
	c.Handle(e.effectHandler())
	start(t, c)
	waitFor(t, 30*time.Second, "redelivery acked as duplicate", func() bool { return c.Stats().Duplicates == 1 })
	require.Equal(t, map[string]int{"m-1": 1}, e.effects())
	s := c.Stats()
	require.EqualValues(t, 1, s.Processed)
	require.GreaterOrEqual(t, s.AcksDropped, int64(1), "the ack of the dead channel must be dropped")
	// Nothing left in the queue: the redelivery was acked on the new channel.
	q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages)
}

func TestHandlerErrorCommitsNothingRetriesThenAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := e.effectHandler()(ctx, tx, m); err != nil {
			return err
		}
		if m.Attempt <= 2 {
			return errors.New("transient failure after writing")
		}
		return nil
	}
	e.publish("m-1", `{"n":1}`, nil)
	c := e.newConsumer(h, nil)
	start(t, c)
	waitFor(t, 20*time.Second, "processed after retries", func() bool { return c.Stats().Processed == 1 })
	require.EqualValues(t, 2, c.Stats().Retried)
	require.Equal(t, map[string]int{"m-1": 1}, e.effects(), "writes of failed attempts must be rolled back")
}

func TestDeadLettersCarryReasonHeaderAndRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Body) == `"permanent"` {
			return Permanent(errors.New("cannot ever work"))
		}
		return e.effectHandler()(ctx, tx, m)
	}
	e.publish("ok-1", `{"n":1}`, nil)
	e.publish("perm-1", `"permanent"`, nil)
	e.publish("", `{"no":"id"}`, nil)
	c := e.newConsumer(h, nil)
	stop := start(t, c)
	waitFor(t, 20*time.Second, "first three settled", func() bool { return settled(c) == 3 })
	e.publish("ok-1", `{"n":"different"}`, nil) // same id, other payload
	waitFor(t, 20*time.Second, "conflict settled", func() bool { return settled(c) == 4 })
	stop()

	require.Equal(t, map[string]int{"ok-1": 1}, e.effects())
	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, 3)
	reasons := map[string]amqp.Delivery{}
	for _, d := range dlq {
		reasons[d.Headers["x-idem-reason"].(string)] = d
	}
	require.Contains(t, reasons, deadletters.ReasonPermanent)
	require.Contains(t, reasons, deadletters.ReasonMissingMessageID)
	require.Contains(t, reasons, deadletters.ReasonPayloadConflict)
	perm := reasons[deadletters.ReasonPermanent]
	require.Equal(t, "test", perm.Headers["x-idem-consumer"])
	require.Equal(t, e.queue, perm.Headers["x-idem-original-routing-key"])
	require.EqualValues(t, 1, perm.Headers["x-idem-attempts"])
	require.Contains(t, perm.Headers["x-idem-error"], "cannot ever work")
	require.NotEmpty(t, reasons[deadletters.ReasonPayloadConflict].Headers["x-idem-stored-hash"])

	rows, err := e.pool.Query(context.Background(), `SELECT reason, message_id, error FROM `+e.tables.Table("dead_letters")+` ORDER BY reason`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]string, error) {
		var v [3]string
		return v, r.Scan(&v[0], &v[1], &v[2])
	})
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, deadletters.ReasonMissingMessageID, got[0][0])
	require.Equal(t, deadletters.ReasonPayloadConflict, got[1][0])
	require.Equal(t, "ok-1", got[1][1])
	require.Equal(t, deadletters.ReasonPermanent, got[2][0])
	require.Contains(t, got[2][2], "cannot ever work")
	require.EqualValues(t, 1, c.Stats().Conflicts)
}

func TestRetriesEndInMaxAttemptsDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var attempts sync.Map
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		attempts.Store(m.Attempt, true)
		return errors.New("always failing")
	}
	e.publish("m-1", `{}`, nil)
	c := e.newConsumer(h, func(cfg *Config) { cfg.MaxAttempts = 3 })
	start(t, c)
	waitFor(t, 20*time.Second, "dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	var seen []int
	attempts.Range(func(k, _ any) bool { seen = append(seen, k.(int)); return true })
	require.ElementsMatch(t, []int{1, 2, 3}, seen)
	require.EqualValues(t, 2, c.Stats().Retried)
	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, 1)
	require.Equal(t, deadletters.ReasonMaxAttempts, dlq[0].Headers["x-idem-reason"])
	require.EqualValues(t, 3, dlq[0].Headers["x-idem-attempts"])
	require.Equal(t, "m-1", dlq[0].MessageId)
}

func TestHandlerPanicIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.Attempt == 1 {
			panic("boom")
		}
		return e.effectHandler()(ctx, tx, m)
	}
	e.publish("m-1", `{}`, nil)
	c := e.newConsumer(h, nil)
	start(t, c)
	waitFor(t, 20*time.Second, "processed after panic", func() bool { return c.Stats().Processed == 1 })
	require.Equal(t, map[string]int{"m-1": 1}, e.effects())
	require.EqualValues(t, 1, c.Stats().Retried)
}

func TestDecodeErrorIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	type deposit struct {
		Amount int `json:"amount"`
	}
	h := JSON(func(ctx context.Context, tx pgx.Tx, m *Message, d deposit) error {
		return e.effectHandler()(ctx, tx, m)
	})
	e.publish("bad-1", `{"amount": "not a number"`, nil)
	e.publish("ok-1", `{"amount": 5}`, nil)
	c := e.newConsumer(h, nil)
	start(t, c)
	waitFor(t, 20*time.Second, "both settled", func() bool { return settled(c) == 2 })
	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, 1)
	require.Equal(t, deadletters.ReasonDecodeError, dlq[0].Headers["x-idem-reason"])
	require.Equal(t, map[string]int{"ok-1": 1}, e.effects())
}

func TestOneBadMessageInBatchLetsTheOthersCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	for i := 0; i < 50; i++ {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
	}
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := e.effectHandler()(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "m-25" {
			// A failing statement aborts the transaction; only this
			// message's savepoint may be rolled back.
			_, err := tx.Exec(ctx, "SELECT 1/0")
			return Permanent(err)
		}
		return nil
	}
	// One worker and a batch wide enough that the 50 buffered messages share
	// transactions with m-25.
	c := e.newConsumer(h, func(cfg *Config) { cfg.Workers = 1; cfg.BatchMaxSize = 50; cfg.BatchMaxWait = 50 * time.Millisecond })
	start(t, c)
	waitFor(t, 20*time.Second, "all settled", func() bool { return settled(c) == 50 })
	eff := e.effects()
	require.Len(t, eff, 49)
	require.NotContains(t, eff, "m-25")
	require.Less(t, c.Stats().Batches, int64(50), "messages must have been batched")
	require.EqualValues(t, 1, c.Stats().DeadLettered)
}

func TestDeadlockRetriesTheBatchNotTheHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if calls.Add(1) == 1 {
			// What pgx returns when PostgreSQL picks this transaction as a
			// deadlock victim.
			return fmt.Errorf("update hot row: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return e.effectHandler()(ctx, tx, m)
	}
	e.publish("m-1", `{}`, nil)
	c := e.newConsumer(h, nil)
	start(t, c)
	waitFor(t, 20*time.Second, "processed", func() bool { return c.Stats().Processed == 1 })
	s := c.Stats()
	require.Zero(t, s.Retried, "a deadlock is not a handler failure")
	require.Zero(t, s.DeadLettered)
	require.Equal(t, map[string]int{"m-1": 1}, e.effects())
}

func TestBackendTerminatedMidBatchCostsARetryNotAMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	const n = 100
	for i := 0; i < n; i++ {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
	}
	var killed atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := e.effectHandler()(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "m-50" && killed.Add(1) <= 2 {
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT 1") // fails: the backend is gone
			return err
		}
		return nil
	}
	c := e.newConsumer(h, nil)
	start(t, c)
	waitFor(t, 30*time.Second, "all processed", func() bool { return c.Stats().Processed == n })
	eff := e.effects()
	require.Len(t, eff, n)
	for id, k := range eff {
		require.Equal(t, 1, k, "message %s applied %d times", id, k)
	}
	require.Zero(t, c.Stats().DeadLettered)
	require.GreaterOrEqual(t, killed.Load(), int32(2))
}

func TestAllConnectionsClosedMidStreamLoseNothingAndDoubleNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testbroker.NewProxy(t)
	e.declare(nil)
	const n = 2000
	go func() {
		// A separate publisher connection: publishing goes on while the
		// consumer's connections are cut.
		ch := testbroker.Channel(t)
		for i := 0; i < n; i++ {
			_ = ch.PublishWithContext(context.Background(), "", e.queue, false, false, amqp.Publishing{
				MessageId: fmt.Sprintf("m-%d", i), Body: []byte(`{}`), DeliveryMode: amqp.Persistent})
		}
	}()
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = proxy.URL() })
	start(t, c)
	for cut := 1; cut <= 3; cut++ {
		waitFor(t, 30*time.Second, "progress before cut", func() bool { return c.Stats().Processed >= int64(cut*n/5) })
		proxy.Sever()
	}
	waitFor(t, 60*time.Second, "every message applied", func() bool {
		return e.count(`SELECT count(DISTINCT message_id) FROM `+e.tables.QuotedSchema()+`.effects`) == n
	})
	eff := e.effects()
	require.Len(t, eff, n)
	for id, k := range eff {
		require.Equal(t, 1, k, "message %s applied %d times", id, k)
	}
	waitFor(t, 30*time.Second, "queue empty", func() bool {
		q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
}

func TestShutdownUnderLoadAcksOnlyCommittedMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	const n = 1000
	for i := 0; i < n; i++ {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
	}
	slow := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		time.Sleep(time.Millisecond)
		return e.effectHandler()(ctx, tx, m)
	}
	c := e.newConsumer(slow, nil)
	stop := start(t, c)
	waitFor(t, 30*time.Second, "some progress", func() bool { return c.Stats().Processed > 100 })
	stop()
	committed := len(e.effects())
	require.Less(t, committed, n, "shutdown came too late to test anything")
	// Every message is either committed (and acked) or back in the queue.
	waitFor(t, 10*time.Second, "unacked messages back in the queue", func() bool {
		q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
		return err == nil && q.Messages == n-committed
	})

	c2 := e.newConsumer(e.effectHandler(), nil)
	start(t, c2)
	waitFor(t, 30*time.Second, "the rest processed", func() bool { return len(e.effects()) == n })
	for id, k := range e.effects() {
		require.Equal(t, 1, k, "message %s applied %d times", id, k)
	}
}

func TestOrderingKeyKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	const keys, perKey = 8, 50
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			e.publish(fmt.Sprintf("k%d-%03d", k, i), fmt.Sprintf(`{"key":"k%d"}`, k), amqp.Table{"key": fmt.Sprintf("k%d", k)})
		}
	}
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) {
		cfg.Workers = 4
		cfg.OrderingKey = func(m *Message) string { s, _ := m.Headers["key"].(string); return s }
	})
	start(t, c)
	waitFor(t, 30*time.Second, "all processed", func() bool { return c.Stats().Processed == keys*perKey })
	rows, err := e.pool.Query(context.Background(), `SELECT message_id FROM `+e.tables.QuotedSchema()+`.effects ORDER BY seq`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	last := map[string]string{}
	for _, id := range ids {
		k := id[:2]
		require.Less(t, last[k], id, "key %s out of order", k)
		last[k] = id
	}
}

func TestHandlerThatSwallowsAFailedStatementDoesNotCommitOrStall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "swallower" {
			_, _ = tx.Exec(ctx, "SELECT 1/0") // error ignored: the transaction is aborted
			return nil
		}
		return e.effectHandler()(ctx, tx, m)
	}
	for i := 0; i < 10; i++ {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
	}
	e.publish("swallower", `{}`, nil)
	c := e.newConsumer(h, func(cfg *Config) { cfg.MaxAttempts = 2; cfg.Workers = 1; cfg.BatchMaxWait = 20 * time.Millisecond })
	start(t, c)
	waitFor(t, 20*time.Second, "all settled", func() bool { return settled(c) == 11 })
	require.Len(t, e.effects(), 10)
	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, 1)
	require.Equal(t, deadletters.ReasonMaxAttempts, dlq[0].Headers["x-idem-reason"])
	require.Contains(t, dlq[0].Headers["x-idem-error"], "aborted the transaction")
}

func TestDeferredWritesCommitOnceAndTheirErrorsReachTheHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	var errs sync.Map
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		sql := `INSERT INTO ` + e.tables.QuotedSchema() + `.effects (message_id) VALUES ($1)`
		if m.ID == "bad" {
			sql = `INSERT INTO no_such_table VALUES ($1)`
		}
		err := Defer(ctx, tx, sql, m.ID)
		if err != nil {
			errs.Store(m.ID, err)
			return Permanent(err)
		}
		return nil
	}
	for i := 0; i < 20; i++ {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
		if i == 10 {
			e.publish("bad", `{}`, nil)
		}
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.Workers = 1; cfg.BatchMaxWait = 20 * time.Millisecond })
	start(t, c)
	waitFor(t, 20*time.Second, "all settled", func() bool { return settled(c) == 41 })
	eff := e.effects()
	require.Len(t, eff, 20)
	for id, n := range eff {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
	_, found := errs.Load("bad")
	require.True(t, found, "the failing deferred statement's error must reach its handler")
	require.EqualValues(t, 1, c.Stats().DeadLettered)
}

func TestDeletedDeadLetterQueueIsDeclaredAgainAndNothingIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "bad" {
			return Permanent(errors.New("never"))
		}
		return e.effectHandler()(ctx, tx, m)
	}
	c := e.newConsumer(h, nil)
	start(t, c)
	e.publish("ok-1", `{}`, nil)
	waitFor(t, 20*time.Second, "running", func() bool { return c.Stats().Processed == 1 })
	_, err := e.ch.QueueDelete(e.queue+".dlq", false, false, false)
	require.NoError(t, err)

	e.publish("bad", `{}`, nil)
	conn := testbroker.Dial(t)
	waitFor(t, 30*time.Second, "dead letter stored in a declared-again DLQ", func() bool {
		ch, err := conn.Channel() // a passive declare of a missing queue closes its channel
		require.NoError(t, err)
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(e.queue+".dlq", true, false, false, false, nil)
		return err == nil && q.Messages >= 1
	})
	dlq := e.drain(e.queue + ".dlq")
	require.NotEmpty(t, dlq)
	require.Equal(t, "bad", dlq[0].MessageId)
	require.GreaterOrEqual(t, c.Stats().Reconnects, int64(1))
	waitFor(t, 10*time.Second, "queue empty", func() bool {
		q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
}
