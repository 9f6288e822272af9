package consumer

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/partitions"
)

// A partitioned consumer declares the exchange named after its Queue, of
// type x-consistent-hash, and its partitions behind it: quorum queues with
// a single active consumer and a retry queue each, all bound with one
// weight, and one dead-letter queue.
func TestPartitionedTopologyIsAConsistentHashExchangeInFrontOfItsPartitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testbroker.PartitionsAtEnd(t, e.queue, 4)
	e.declare(func(c *Config) { c.Partitions = 4; c.OrderingKey = func(m *Message) string { return m.ID } })
	ch := testbroker.Channel(t)
	require.NoError(t, ch.ExchangeDeclarePassive(e.queue, partitions.ExchangeType, true, false, false, false, nil))
	for i := range 4 {
		q := partitions.QueueName(e.queue, i)
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
			"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.queue + ".dlq",
			"x-delivery-limit": int64(20), "x-single-active-consumer": true,
		})
		require.NoError(t, err, "partition %d is a quorum queue with a single active consumer", i)
		_, err = ch.QueueDeclarePassive(q+".retry", true, false, false, false, nil)
		require.NoError(t, err, "partition %d has its retry queue", i)
	}
	// Every key lands in some partition: 200 keys published to the exchange
	// all arrive, and spread over the four.
	require.NoError(t, ch.Confirm(false))
	for i := range 200 {
		dc, err := partitions.Publish(context.Background(), ch, e.queue, 4, fmt.Sprintf("k-%d", i), amqp.Publishing{Body: []byte("{}")})
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
	total := 0
	for i := range 4 {
		q, err := ch.QueueDeclarePassive(partitions.QueueName(e.queue, i), true, false, false, false, nil)
		require.NoError(t, err)
		require.Greater(t, q.Messages, 10, "partition %d gets its part of the keys", i)
		total += q.Messages
	}
	require.Equal(t, 200, total)
}

func TestNewRefusesPartitionsWithoutAQueueOrWithARetryQueueOrClassicQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for name, edit := range map[string]func(*Config){
		"negative":    func(c *Config) { c.Partitions = -1 },
		"too many":    func(c *Config) { c.Partitions = 5000 },
		"no queue":    func(c *Config) { c.Partitions = 4; c.Queue = "" },
		"retry queue": func(c *Config) { c.Partitions = 4; c.RetryQueue = "elsewhere" },
		"classic":     func(c *Config) { c.Partitions = 4; c.QueueType = "classic" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := e.config()
			edit(&cfg)
			_, err := New(cfg)
			require.ErrorIs(t, err, ErrConfig)
		})
	}
}

// Three worker processes on eight partitions while events flow: every event
// applied once, none out of its account's order, each process applying its
// share. One of them is killed with SIGKILL mid-run: within 10 s of the
// kill every partition is consumed again by a survivor (the bound the
// partitions promise), what the dead one left unacked applied or skipped
// before the later events of its keys. Then a fourth process joins while
// events still flow: partitions move to it, each consumed by the process
// holding its lock only, none out of order, and it applies its share.
func TestPartitionsKeepEachKeysOrderAcrossProcessesAndAKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// 50 accounts: every partition gets some (the exchange hashes them), so
	// every process, the one that joins included, has events to apply; at
	// 2,000 events a second each account has a few in every partition's
	// backlog while it changes hands.
	const parts, accounts = 8, 50
	const takeoverBound = 10 * time.Second
	testbroker.PartitionsAtEnd(t, e.queue, parts)
	e.createOrderedTables()
	e.declare(func(c *Config) { c.Partitions = parts; c.OrderingKey = func(m *Message) string { return m.ID } })
	partOf := e.partitionsOfAccounts(parts, accounts)
	applied := func(label string) int {
		return e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE label = $1`, label)
	}
	broker := testbroker.Channel(t)
	oneConsumerEach := func() string {
		if c := partitionConsumers(t, broker, e.queue, parts); slices.ContainsFunc(c, func(n int) bool { return n != 1 }) {
			return fmt.Sprintf("partition queues' consumers %v, want one each", c)
		}
		return ""
	}

	workers := map[string]*exec.Cmd{}
	for _, name := range []string{"w1", "w2", "w3"} {
		workers[name] = e.startOrderedWorker(parts, name)
	}
	flow := e.flowEvents(parts, accounts)

	// Every process applies events and holds its share, each partition
	// consumed once, before one is killed: the observables the takeover is
	// judged by hold in the steady state first.
	pollUntil(t, time.Now().Add(60*time.Second), "three processes applying events, the partitions spread over them", func() string {
		flow.check(t)
		if why := e.leaseOf(parts).spreadOver("w1", "w2", "w3"); why != "" {
			return why
		}
		for _, name := range []string{"w1", "w2", "w3"} {
			if n := applied(name); n < 200 {
				return fmt.Sprintf("%s applied %d events", name, n)
			}
		}
		return oneConsumerEach()
	})
	before := e.leaseOf(parts)
	t.Logf("before the kill: %s", before)

	// A partition is consumed again once a survivor applied one of its
	// events after the kill: for w2's partitions that takes a survivor's
	// consumer to become the partition queue's active consumer, which the
	// broker allows only once it dropped w2's, and nothing before the kill
	// counts (times are the database's, like the applied rows'). w2's
	// sessions gone, the lease's locks held by the survivors within their
	// share, and one consumer per partition queue must hold too: they say
	// where it is stuck if not.
	deadline, killAt := time.Now().Add(takeoverBound), e.dbNow()
	require.NoError(t, workers["w2"].Process.Signal(syscall.SIGKILL))
	_ = workers["w2"].Wait()
	var relocked time.Time
	var firsts map[int]map[string]time.Time
	pollUntil(t, deadline, fmt.Sprintf("every partition consumed by a survivor within %s of the kill", takeoverBound), func() string {
		flow.check(t)
		st := e.leaseOf(parts)
		if n := st.backends["w2"]; n > 0 {
			return fmt.Sprintf("w2's %d sessions still open; %s", n, st)
		}
		if why := st.spreadOver("w1", "w3"); why != "" {
			return why + "; " + st.String()
		}
		if relocked.IsZero() {
			relocked = e.dbNow()
		}
		firsts = e.firstAppliedSince(killAt, partOf)
		for i := range parts {
			if firsts[i]["w1"].IsZero() && firsts[i]["w3"].IsZero() {
				return fmt.Sprintf("partition %d: no event applied by a survivor since the kill; %s", i, st)
			}
		}
		return oneConsumerEach()
	})
	var handover []string
	for _, i := range before.held("w2") {
		first := firsts[i]["w1"]
		if t3 := firsts[i]["w3"]; first.IsZero() || (!t3.IsZero() && t3.Before(first)) {
			first = t3
		}
		handover = append(handover, fmt.Sprintf("p%d %v", i, first.Sub(killAt).Round(time.Millisecond)))
	}
	t.Logf("takeover of w2's partitions: survivors held every lock %v after the kill; first event applied by a survivor: %s",
		relocked.Sub(killAt).Round(time.Millisecond), strings.Join(handover, ", "))

	// A fourth process joins while events still flow: the others let
	// partitions go (stopping first) and it takes them, each process at
	// most its share. From then on each partition's events are applied by
	// the process holding its lock, and by no other.
	started := time.Now()
	joinAt := e.dbNow()
	workers["w4"] = e.startOrderedWorker(parts, "w4")
	// The join itself takes about two Intervals once w4 runs (it is
	// logged below); the bound also covers starting a race-built process
	// and its first connections on a machine that runs every package's
	// tests at once.
	pollUntil(t, started.Add(60*time.Second), "the partitions spread over w1, w3 and the joining w4", func() string {
		flow.check(t)
		st := e.leaseOf(parts)
		if why := st.spreadOver("w1", "w3", "w4"); why != "" {
			return why + "; " + st.String()
		}
		return oneConsumerEach()
	})
	spread := e.dbNow()
	joined := e.leaseOf(parts)
	t.Logf("w4 joined %v after it started: %s", time.Since(started).Round(time.Millisecond), joined)
	require.NotEmpty(t, joined.held("w4"), "w4 holds partitions: %s", joined)
	pollUntil(t, time.Now().Add(30*time.Second), "an event of every partition applied after the partitions spread over w1, w3 and w4", func() string {
		flow.check(t)
		firsts = e.firstAppliedSince(spread, partOf)
		for i := range parts {
			if len(firsts[i]) == 0 {
				return fmt.Sprintf("partition %d: no event applied since", i)
			}
		}
		return ""
	})
	now := e.leaseOf(parts)
	require.Equal(t, joined.holder, now.holder, "the lease is steady once spread: %s, then %s", joined, now)
	for i := range parts {
		require.Equal(t, []string{joined.holder[i]}, slices.Sorted(maps.Keys(firsts[i])),
			"partition %d's events are applied by the process holding its lock only", i)
	}
	events := flow.finish(t)
	waitFor(t, 2*time.Minute, "every event applied", func() bool {
		return e.count(`SELECT count(DISTINCT message_id) FROM `+e.tables.QuotedSchema()+`.applied`) == events
	})
	require.Equal(t, events, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied`), "each event applied once")
	if n := e.count(`SELECT count(*) FROM ` + e.tables.QuotedSchema() + `.violations`); n > 0 {
		e.logViolations(killAt, joinAt)
		t.Fatalf("%d events applied out of their account's order", n)
	}
	for _, name := range []string{"w1", "w2", "w3", "w4"} {
		t.Logf("%s applied %d of %d events", name, applied(name), events)
	}
	require.Positive(t, applied("w4"), "the process that joined applies its share")
}

// createOrderedTables creates the tables of testworker's ordered mode. An
// applied event's row also says when its transaction applied it (at), for
// the report of events out of order.
func (e *env) createOrderedTables() {
	e.t.Helper()
	s := e.tables.QuotedSchema()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE `+s+`.last_seq (account text PRIMARY KEY, seq int NOT NULL);
		CREATE TABLE `+s+`.violations (account text NOT NULL, seq int NOT NULL, after int NOT NULL);
		CREATE TABLE `+s+`.applied (message_id text NOT NULL, label text NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(e.t, err)
}

// A process of a partitioned consumer is ready while it consumes the
// partitions it holds, and also while it holds none (more processes than
// partitions): it stands by, and takes the partition of a process that
// leaves.
func TestAPartitionedConsumerHoldingNoPartitionIsAReadyStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testbroker.PartitionsAtEnd(t, e.queue, 1)
	edit := func(c *Config) { c.Partitions = 1; c.OrderingKey = func(m *Message) string { return m.ID } }
	e.declare(edit)
	a, b := e.newConsumer(e.effectHandler(), edit), e.newConsumer(e.effectHandler(), edit)
	stopA := start(t, a)
	waitFor(t, 15*time.Second, "a ready", func() bool { return a.Health().Ready })
	start(t, b)
	waitFor(t, 15*time.Second, "b ready as a standby", func() bool { return b.Health().Ready })

	publish := func(id string) {
		ch := testbroker.Channel(t)
		require.NoError(t, ch.Confirm(false))
		dc, err := partitions.Publish(context.Background(), ch, e.queue, 1, id, amqp.Publishing{MessageId: id, Body: []byte(`{}`)})
		require.NoError(t, err)
		_, err = dc.WaitContext(context.Background())
		require.NoError(t, err)
	}
	publish("m-1")
	// A message is counted once the broker has been told, just after its
	// effect commits.
	waitFor(t, 15*time.Second, "m-1 applied by the holder", func() bool { return e.effects()["m-1"] == 1 && a.Stats().Processed == 1 })

	stopA()
	publish("m-2")
	waitFor(t, 15*time.Second, "m-2 applied by the standby", func() bool { return e.effects()["m-2"] == 1 && b.Stats().Processed == 1 })
	require.EqualValues(t, 1, a.Stats().Processed, "the holder that left applied nothing more")
	require.True(t, b.Health().Ready, b.Health().Reason)
}
