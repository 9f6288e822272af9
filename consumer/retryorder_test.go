package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/partitions"
)

// The premise of holding a failed message in its process: when the process
// dies (its connection closes) with deliveries unacked, a quorum queue with
// a single active consumer hands them, in their order, to the next
// consumer before any message published after them.
func TestAQuorumQueueRedeliversReturnedMessagesAheadOfLaterOnes(t *testing.T) {
	t.Parallel()
	q := testbroker.Queue(t)
	ch := testbroker.Channel(t)
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-single-active-consumer": true})
	require.NoError(t, err)
	const n = 40
	for i := 1; i <= n; i++ {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", q, false, false,
			amqp.Publishing{MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent}))
	}
	consume := func(conn *amqp.Connection, prefetch int) <-chan amqp.Delivery {
		c, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, c.Qos(prefetch, 0, false))
		ds, err := c.Consume(q, "", false, false, false, false, nil)
		require.NoError(t, err)
		return ds
	}
	next := func(ds <-chan amqp.Delivery) amqp.Delivery {
		select {
		case d := <-ds:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery within 10s")
			return amqp.Delivery{}
		}
	}
	first := testbroker.Dial(t)
	ds := consume(first, 10)
	standby := consume(testbroker.Dial(t), 100) // waits: the queue has a single active consumer
	// The first consumer settles messages 1–3 and holds 4–10, one of them
	// acked out of order (as a worker acks a later key's message while an
	// earlier one of another key waits), then dies.
	for i := 1; i <= 10; i++ {
		d := next(ds)
		require.Equal(t, strconv.Itoa(i), d.MessageId)
		if i <= 3 || i == 7 {
			require.NoError(t, d.Ack(false))
		}
	}
	require.NoError(t, first.Close())
	var got []string
	for range n - 4 {
		got = append(got, next(standby).MessageId)
	}
	var want []string
	for i := 4; i <= n; i++ {
		if i != 7 {
			want = append(want, strconv.Itoa(i))
		}
	}
	require.Equal(t, want, got, "the returned messages come first, in order, then the later ones")
}

// seqEvent is an account's event: it must be applied right after the
// account's event seq-1.
type seqEvent struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

// accountKey is the ordering key of a seqEvent.
func accountKey(m *Message) string {
	var ev seqEvent
	_ = json.Unmarshal(m.Body, &ev)
	return ev.Account
}

// eventID is the message id of an account's event.
func eventID(account string, seq int) string { return fmt.Sprintf("%s/%d", account, seq) }

// applyInOrder returns a handler that applies seqEvents as testworker's
// ordered mode does (the tables of createOrderedTables): an event that
// does not follow the last one applied for its account is recorded in
// violations, and each applied event in applied, under label. An attempt
// for which fail reports true fails before writing anything.
func (e *env) applyInOrder(label string, fail func(ev seqEvent, attempt int) bool) Handler {
	s := e.tables.QuotedSchema()
	return JSON(func(ctx context.Context, tx pgx.Tx, m *Message, ev seqEvent) error {
		if fail(ev, m.Attempt) {
			return fmt.Errorf("attempt %d of %s fails", m.Attempt, m.ID)
		}
		var last int
		if err := tx.QueryRow(ctx, `INSERT INTO `+s+`.last_seq (account, seq) VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET seq = EXCLUDED.seq
			RETURNING COALESCE((SELECT seq FROM `+s+`.last_seq WHERE account = $1), 0)`, ev.Account, ev.Seq).Scan(&last); err != nil {
			return err
		}
		if ev.Seq != last+1 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.violations (account, seq, after) VALUES ($1, $2, $3)`, ev.Account, ev.Seq, last); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+s+`.applied (message_id, label) VALUES ($1, $2)`, m.ID, label)
		return err
	})
}

// failFirstOfFive fails the first attempt of one event in five.
func failFirstOfFive(ev seqEvent, attempt int) bool { return attempt == 1 && ev.Seq%5 == 3 }

// publishEvents publishes events seq 1…events of each of accounts, one
// seq of every account after the other, straight to e's queue or, with
// parts > 0, through its partitions' exchange; it waits for the broker's
// confirms.
func (e *env) publishEvents(accounts []string, events, parts int) {
	e.t.Helper()
	ch := testbroker.Channel(e.t)
	require.NoError(e.t, ch.Confirm(false))
	var confirms []*amqp.DeferredConfirmation
	for seq := 1; seq <= events; seq++ {
		for _, a := range accounts {
			body, _ := json.Marshal(seqEvent{Account: a, Seq: seq})
			msg := amqp.Publishing{MessageId: eventID(a, seq), Body: body, DeliveryMode: amqp.Persistent}
			var dc *amqp.DeferredConfirmation
			var err error
			if parts > 0 {
				dc, err = partitions.Publish(context.Background(), ch, e.queue, parts, a, msg)
			} else {
				dc, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.queue, true, false, msg)
			}
			require.NoError(e.t, err)
			confirms = append(confirms, dc)
		}
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(context.Background())
		require.NoError(e.t, err)
		require.True(e.t, ok)
	}
}

// accounts returns n account names.
func accounts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("acct-%d", i)
	}
	return out
}

// applied is how many events were applied (of account, when given).
func (e *env) applied(account string) int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE $1 = '' OR message_id LIKE $1 || '/%'`, account)
}

// requireEachAppliedOnceInOrder checks that n events were applied, each
// once, none out of its account's order.
func (e *env) requireEachAppliedOnceInOrder(n int) {
	e.t.Helper()
	s := e.tables.QuotedSchema()
	require.Equal(e.t, n, e.count(`SELECT count(DISTINCT message_id) FROM `+s+`.applied`), "every event applied")
	require.Equal(e.t, n, e.count(`SELECT count(*) FROM `+s+`.applied`), "each event applied once")
	var first []string
	rows, err := e.pool.Query(context.Background(), `SELECT account || '/' || seq || ' after ' || after FROM `+s+`.violations LIMIT 10`)
	require.NoError(e.t, err)
	for rows.Next() {
		var v string
		require.NoError(e.t, rows.Scan(&v))
		first = append(first, v)
	}
	require.NoError(e.t, rows.Err())
	if len(first) > 0 {
		e.t.Fatalf("%d of %d events applied out of their account's order, first %v",
			e.count(`SELECT count(*) FROM `+s+`.violations`), n, first)
	}
}

// The scenario that a retry queue breaks: 10 accounts × 30 events, the
// first attempt of one event in five failing. With an OrderingKey, a
// failed event holds its account: its later events wait for its retry.
func TestAFailedMessageHoldsItsKeyWithAnOrderingKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createOrderedTables()
	e.declare(nil)
	const n, events = 10, 30
	e.publishEvents(accounts(n), events, 0)
	c := e.newConsumer(e.applyInOrder("c", failFirstOfFive), func(cfg *Config) {
		cfg.OrderingKey = accountKey
		cfg.Workers = 4
	})
	start(t, c)
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.applied("") >= n*events })
	e.requireEachAppliedOnceInOrder(n * events)
	st := c.Stats()
	require.EqualValues(t, n*events/5, st.Retried, "one event in five retried")
	require.Zero(t, st.DeadLettered)
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("attempts")), "the attempts of settled messages are cleared")
	require.Empty(t, e.drain(e.queue+".retry"), "nothing parked in the retry queue")
}

// consuming is how many partitions c consumes now (a session consuming).
func consuming(c *Consumer) int {
	p := c.src.(*partitionedSource)
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, src := range p.parts {
		if src.connected.Load() {
			n++
		}
	}
	return n
}

// The same scenario on 4 partitions shared by two consumers: each key's
// order holds across them while its failed events retry.
func TestAFailedMessageHoldsItsKeyAcrossPartitionedConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const parts, n, events = 4, 10, 30
	testbroker.PartitionsAtEnd(t, e.queue, parts)
	e.createOrderedTables()
	edit := func(cfg *Config) { cfg.Partitions, cfg.OrderingKey, cfg.Workers = parts, accountKey, 2 }
	e.declare(edit)
	a := e.newConsumer(e.applyInOrder("a", failFirstOfFive), edit)
	b := e.newConsumer(e.applyInOrder("b", failFirstOfFive), edit)
	start(t, a)
	start(t, b)
	waitFor(t, 60*time.Second, "the partitions shared by both consumers", func() bool {
		return consuming(a) > 0 && consuming(b) > 0 && consuming(a)+consuming(b) == parts
	})
	e.publishEvents(accounts(n), events, parts)
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.applied("") >= n*events })
	e.requireEachAppliedOnceInOrder(n * events)
	sa, sb := a.Stats(), b.Stats()
	require.EqualValues(t, n*events/5, sa.Retried+sb.Retried, "one event in five retried")
	require.Positive(t, sa.Processed, "consumer a applied its share")
	require.Positive(t, sb.Processed, "consumer b applied its share")
}

// While a key waits for its failed message's retry, other keys flow, even
// on the one worker they share with it: their events commit, and none of
// the key's later events does, until the failed one succeeds.
func TestAKeyWaitingForItsRetryDoesNotHoldOtherKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createOrderedTables()
	e.declare(nil)
	var failing atomic.Bool
	failing.Store(true)
	c := e.newConsumer(e.applyInOrder("c", func(ev seqEvent, _ int) bool {
		return ev.Account == "slow" && ev.Seq == 1 && failing.Load()
	}), func(cfg *Config) {
		cfg.OrderingKey = accountKey
		cfg.Workers = 1 // every key on the one worker
		cfg.MaxAttempts = 1000
	})
	start(t, c)
	others := accounts(9)
	e.publishEvents([]string{"slow"}, 1, 0)
	waitFor(t, 30*time.Second, "slow/1 failed", func() bool { return c.Stats().Retried > 0 })
	e.publishEvents(append([]string{"slow"}, others...), 10, 0) // slow/1 again: a duplicate publish of it
	for _, a := range others {
		waitFor(t, 60*time.Second, "the other accounts' events applied while slow/1 retries", func() bool { return e.applied(a) == 10 })
	}
	require.Zero(t, e.applied("slow"), "no event of the held key applied before its failed one")
	retries := c.Stats().Retried
	require.Greater(t, retries, int64(1), "slow/1 kept retrying meanwhile, with backoff")
	failing.Store(false)
	waitFor(t, 60*time.Second, "the held key's events applied", func() bool { return e.applied("slow") == 10 })
	e.requireEachAppliedOnceInOrder(100)
	require.EqualValues(t, 1, c.Stats().Duplicates, "slow/1's second publish")
	t.Logf("slow/1 failed %d times while the other keys' 90 events committed", retries)
}

// A message that fails MaxAttempts times is dead-lettered (reason
// max_attempts, with its attempts), and only then do its key's later
// messages apply, without it: counted as a gap in the key's order.
func TestAKeyMovesOnOnceItsFailedMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createOrderedTables()
	e.declare(nil)
	c := e.newConsumer(e.applyInOrder("c", func(ev seqEvent, _ int) bool { return ev.Account == "k" && ev.Seq == 2 }),
		func(cfg *Config) {
			cfg.OrderingKey = accountKey
			cfg.MaxAttempts = 3
		})
	start(t, c)
	e.publishEvents([]string{"k", "other"}, 5, 0)
	waitFor(t, 60*time.Second, "k's later events applied", func() bool { return e.applied("k") == 4 && e.applied("other") == 5 })
	s := e.tables.QuotedSchema()
	var reason string
	var attempts int
	var deadAt time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT reason, attempts, dead_lettered_at FROM `+
		e.tables.Table("dead_letters")+` WHERE message_id = 'k/2'`).Scan(&reason, &attempts, &deadAt))
	require.Equal(t, "max_attempts", reason)
	require.Equal(t, 3, attempts)
	var order []string
	rows, err := e.pool.Query(context.Background(), `SELECT message_id FROM `+s+`.applied WHERE message_id LIKE 'k/%' ORDER BY at`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"k/1", "k/3", "k/4", "k/5"}, order)
	require.Zero(t, e.count(`SELECT count(*) FROM `+s+`.applied WHERE message_id LIKE 'k/%' AND at < $1`, deadAt.Add(-time.Millisecond))-1,
		"k/3, k/4 and k/5 applied after k/2's dead letter, only k/1 before")
	// The copy goes to the dead-letter queue after the commit that wrote
	// the row: wait for it.
	var dlq []amqp.Delivery
	waitFor(t, 30*time.Second, "k/2's copy in the dead-letter queue", func() bool {
		dlq = append(dlq, e.drain(e.queue+".dlq")...)
		return len(dlq) > 0
	})
	require.Len(t, dlq, 1)
	require.Equal(t, "k/2", dlq[0].MessageId)
	waitFor(t, 30*time.Second, "the dead letter counted (after its ack)", func() bool { return c.Stats().DeadLettered == 1 })
	st := c.Stats()
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 1, st.OrderGaps, "the dead letter is a gap in its key's order")
	require.EqualValues(t, 2, st.Retried)
}

// attemptLog records the attempts a handler saw of one message, by label.
type attemptLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *attemptLog) add(label string, attempt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.seen) == 0 || l.seen[len(l.seen)-1] != fmt.Sprintf("%s:%d", label, attempt) {
		l.seen = append(l.seen, fmt.Sprintf("%s:%d", label, attempt)) // a batch run again with savepoints calls it twice
	}
}

func (l *attemptLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// Shutdown while a key waits for its failed message's retry does not wait
// for the backoff, and acks nothing of the key: its messages go back to
// the queue, in order, its failed attempt counted, and the next consumer
// applies them in order, the failed one at its next attempt.
func TestShutdownDuringAHeldRetryLeavesTheKeyInTheQueueInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createOrderedTables()
	e.declare(nil)
	k1 := &attemptLog{}
	failFirstOfK1 := func(label string) func(seqEvent, int) bool {
		return func(ev seqEvent, attempt int) bool {
			if ev.Account == "k" && ev.Seq == 1 {
				k1.add(label, attempt)
				return attempt == 1
			}
			return false
		}
	}
	first := e.newConsumer(e.applyInOrder("first", failFirstOfK1("first")), func(cfg *Config) {
		cfg.OrderingKey = accountKey
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = time.Hour, time.Hour
	})
	stop := start(t, first)
	e.publishEvents([]string{"k", "other"}, 5, 0)
	waitFor(t, 60*time.Second, "k/1 failed, the other key's events applied", func() bool {
		return first.Stats().Retried > 0 && e.applied("other") == 5
	})
	began := time.Now()
	stop()
	require.Less(t, time.Since(began), 15*time.Second, "shutdown does not wait for the retry's backoff")
	require.Zero(t, e.applied("k"))
	// The broker requeues a closed session's unacked messages on its own
	// time, after the close.
	ch := testbroker.Channel(t)
	var ready int
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
		require.NoError(t, err)
		ready = q.Messages
		return ready >= 5
	}, 10*time.Second, 20*time.Millisecond, "k's five events are back in the queue, none acked (%d)", ready)
	require.Equal(t, 5, ready, "k's five events are back in the queue, none acked")
	require.Empty(t, e.drain(e.queue+".retry"), "nothing parked in the retry queue")
	require.Equal(t, 1, e.count(`SELECT failures FROM `+e.tables.Table("attempts")+` WHERE message_id = 'k/1'`),
		"k/1's failed attempt is counted in the database")

	second := e.newConsumer(e.applyInOrder("second", failFirstOfK1("second")), func(cfg *Config) { cfg.OrderingKey = accountKey })
	start(t, second)
	waitFor(t, 60*time.Second, "k's events applied by the next consumer", func() bool { return e.applied("k") == 5 })
	e.requireEachAppliedOnceInOrder(10)
	require.Equal(t, []string{"first:1", "second:2"}, k1.get(), "k/1 ran at its next attempt")
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("attempts")))
}

// A process whose broker connection dies while one of its keys waits for a
// retry, and which then leaves: the partition's next consumer gets the
// key's messages first, in order (the broker returns unacked deliveries to
// the head of the queue), runs the failed one at its next attempt (counted
// in the database, not in the dead process), holds the key again while
// that one fails, and applies the key in order.
func TestAKeyHeldWhenItsConsumerDiesResumesInOrderOnTheNextOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const parts = 2
	testbroker.PartitionsAtEnd(t, e.queue, parts)
	e.createOrderedTables()
	edit := func(cfg *Config) { cfg.Partitions, cfg.OrderingKey = parts, accountKey }
	e.declare(edit)
	k1 := &attemptLog{}
	failK1Twice := func(label string) func(seqEvent, int) bool {
		return func(ev seqEvent, attempt int) bool {
			if ev.Account == "k" && ev.Seq == 1 {
				k1.add(label, attempt)
				return attempt <= 2
			}
			return false
		}
	}
	proxy := testbroker.NewProxy(t)
	a := e.newConsumer(e.applyInOrder("a", failK1Twice("a")), func(cfg *Config) {
		edit(cfg)
		cfg.AMQPURL = proxy.URL()
		cfg.RetryBaseDelay, cfg.RetryMaxDelay = time.Hour, time.Hour
	})
	stopA := start(t, a)
	waitFor(t, 60*time.Second, "a consumes both partitions", func() bool { return consuming(a) == parts })
	e.publishEvents([]string{"k", "other"}, 5, parts)
	waitFor(t, 60*time.Second, "k/1 failed in a, the other key's events applied", func() bool {
		return a.Stats().Retried > 0 && e.applied("other") == 5
	})
	require.Zero(t, e.applied("k"))
	b := e.newConsumer(e.applyInOrder("b", failK1Twice("b")), edit)
	start(t, b)
	proxy.Refuse() // a's broker connections die, its deliveries return to their queues
	stopA()        // and a leaves: b takes its partitions
	waitFor(t, 60*time.Second, "k's events applied by b", func() bool { return e.applied("k") == 5 })
	e.requireEachAppliedOnceInOrder(10)
	require.Equal(t, 5, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE label = 'b'`))
	require.Equal(t, []string{"a:1", "b:2", "b:3"}, k1.get(), "k/1's attempts survive its consumer")
	require.EqualValues(t, 1, b.Stats().Retried, "b held k while k/1's second attempt waited")
	require.Zero(t, b.Stats().DeadLettered)
}

// A message whose batch can never commit (a deferred constraint it breaks
// fails the commit) holds its key too, while the batch's other messages
// commit without it: it is tried again in place, its failed attempts
// counted, until it is dead-lettered (max_attempts); then its key moves on.
func TestAMessageWhoseBatchCannotCommitHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createOrderedTables()
	s := e.tables.QuotedSchema()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE `+s+`.parents (id int PRIMARY KEY);
		CREATE TABLE `+s+`.children (parent int REFERENCES `+s+`.parents DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	e.declare(nil)
	apply := e.applyInOrder("c", func(seqEvent, int) bool { return false })
	c := e.newConsumer(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "k/2" { // breaks the constraint: the commit fails
			if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.children VALUES (1)`); err != nil {
				return err
			}
		}
		return apply(ctx, tx, m)
	}, func(cfg *Config) {
		cfg.OrderingKey = accountKey
		cfg.MaxAttempts = 3
		cfg.BatchRetries = 2
	})
	start(t, c)
	e.publishEvents([]string{"k", "other"}, 5, 0)
	waitFor(t, 90*time.Second, "k's later events applied", func() bool { return e.applied("k") == 4 && e.applied("other") == 5 })
	var reason string
	var attempts int
	var deadAt time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT reason, attempts, dead_lettered_at FROM `+
		e.tables.Table("dead_letters")+` WHERE message_id = 'k/2'`).Scan(&reason, &attempts, &deadAt))
	require.Equal(t, "max_attempts", reason)
	require.Equal(t, 3, attempts)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+s+`.applied WHERE message_id LIKE 'k/%' AND at < $1`, deadAt),
		"only k/1 applied before k/2's dead letter")
	require.Zero(t, e.count(`SELECT count(*) FROM `+s+`.violations WHERE account = 'other'`))
	waitFor(t, 30*time.Second, "the dead letter counted as a gap (after its ack)", func() bool { return c.Stats().OrderGaps == 1 })
	require.Positive(t, c.Stats().Unresolved)
}
