package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testbroker"
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

// Three worker processes on eight partitions: every event applied once,
// none out of its account's order, each process applying its share, one of
// them killed with SIGKILL mid-run and its partitions taken over by the
// others in order.
func TestPartitionsKeepEachKeysOrderAcrossProcessesAndAKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const parts, accounts, events = 8, 40, 100
	testbroker.PartitionsAtEnd(t, e.queue, parts)
	e.createOrderedTables()
	e.declare(func(c *Config) { c.Partitions = parts; c.OrderingKey = func(m *Message) string { return m.ID } })

	workers := map[string]*workerProc{}
	for _, name := range []string{"w1", "w2", "w3"} {
		cmd, _ := e.startWorker("ordered", "-partitions", fmt.Sprint(parts), "-label", name)
		workers[name] = &workerProc{cmd: cmd}
	}
	// Events in order per account, 10% of them published a second time a
	// little later; accounts interleaved.
	pub := testbroker.Channel(t)
	require.NoError(t, pub.Confirm(false))
	next := make([]int, accounts)
	var dups []int // accounts' seqs to publish again
	sent, killed := 0, false
	publishEvent := func(a, seq int) {
		body, _ := json.Marshal(map[string]any{"account": fmt.Sprintf("acct-%d", a), "seq": seq})
		dc, err := partitions.Publish(context.Background(), pub, e.queue, parts, fmt.Sprintf("acct-%d", a), amqp.Publishing{
			MessageId: fmt.Sprintf("acct-%d/%d", a, seq), Body: body, DeliveryMode: amqp.Persistent,
		})
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
	for sent < accounts*events {
		a := rand.IntN(accounts)
		if next[a] == events {
			continue
		}
		next[a]++
		publishEvent(a, next[a])
		sent++
		if rand.IntN(10) == 0 {
			dups = append(dups, a*1000+next[a])
		}
		if len(dups) > 20 {
			d := dups[0]
			dups = dups[1:]
			publishEvent(d/1000, d%1000)
		}
		if sent%200 == 0 {
			time.Sleep(100 * time.Millisecond) // about 2,000 events a second
		}
		if !killed && sent == accounts*events*3/4 {
			// Every process applies its share before one is killed.
			waitFor(t, 60*time.Second, "each process applying at least 10% of the events", func() bool {
				for name := range workers {
					if e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE label = $1`, name) < accounts*events/10 {
						return false
					}
				}
				return true
			})
			require.NoError(t, workers["w2"].cmd.Process.Signal(syscall.SIGKILL))
			_ = workers["w2"].cmd.Wait()
			killed = true
		}
	}
	for _, d := range dups {
		publishEvent(d/1000, d%1000)
	}
	waitFor(t, 2*time.Minute, "every event applied", func() bool {
		return e.count(`SELECT count(DISTINCT message_id) FROM `+e.tables.QuotedSchema()+`.applied`) == accounts*events
	})
	require.Equal(t, accounts*events, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied`), "each event applied once")
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.violations`), "no event out of its account's order")
	for name := range workers {
		n := e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE label = $1`, name)
		t.Logf("%s applied %d events", name, n)
	}
}

// workerProc is one worker process of a test.
type workerProc struct{ cmd *exec.Cmd }

// createOrderedTables creates the tables of testworker's ordered mode.
func (e *env) createOrderedTables() {
	e.t.Helper()
	s := e.tables.QuotedSchema()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE `+s+`.last_seq (account text PRIMARY KEY, seq int NOT NULL);
		CREATE TABLE `+s+`.violations (account text NOT NULL, seq int NOT NULL, after int NOT NULL);
		CREATE TABLE `+s+`.applied (message_id text NOT NULL, label text NOT NULL)`)
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
	waitFor(t, 15*time.Second, "m-1 applied", func() bool { return e.effects()["m-1"] == 1 })
	require.EqualValues(t, 1, a.Stats().Processed, "the holder applies it")

	stopA()
	publish("m-2")
	waitFor(t, 15*time.Second, "m-2 applied by the standby", func() bool { return e.effects()["m-2"] == 1 })
	require.EqualValues(t, 1, b.Stats().Processed)
	require.True(t, b.Health().Ready, b.Health().Reason)
}
