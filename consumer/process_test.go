package consumer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testbroker"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testrun"
)

// TestMain lets a test start this binary as a worker process (see
// startWorker): with IDEM_TEST_WORKER set, it runs that worker instead of
// the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("IDEM_TEST_WORKER"); mode != "" {
		os.Exit(runWorker(mode))
	}
	os.Exit(m.Run())
}

// runWorker is a worker process: "poison" exits the process on the
// message "poison"; "memory" reports its resident high-water mark after
// IDEM_TEST_EXPECT messages. Both record one effect per processed message.
func runWorker(mode string) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	tables := idem.Tables{Schema: os.Getenv("IDEM_TEST_SCHEMA")}
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.effects (message_id) VALUES ($1)`
	c, err := New(Config{Name: "test", Pool: pool, Queue: os.Getenv("IDEM_TEST_QUEUE"), AMQPURL: testbroker.URL(),
		Tables: tables, Logger: testrun.Logger(), Workers: 2, QueueType: os.Getenv("IDEM_TEST_QUEUE_TYPE")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hot := `UPDATE ` + tables.QuotedSchema() + `.accounts SET balance = balance + 1 WHERE id = $1`
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if mode == "poison" && m.ID == "poison" {
			os.Exit(3) // the process dies with the message unacked
		}
		if mode == "hot" {
			if _, err := tx.Exec(ctx, hot, hotAccount(m.ID)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, insert, m.ID)
		return err
	})
	expect, _ := strconv.ParseInt(os.Getenv("IDEM_TEST_EXPECT"), 10, 64)
	go func() { // owned: ends with the process
		for mode == "memory" && settled(c) < expect {
			time.Sleep(10 * time.Millisecond)
		}
		if mode == "memory" {
			fmt.Printf("vmhwm=%d\n", vmHWM())
			cancel()
		}
	}()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// hotAccounts is how many rows the "hot" workers' handlers update.
const hotAccounts = 20

// hotAccount is the account a message of the "hot" workers updates.
func hotAccount(id string) int {
	h := 0
	for _, c := range []byte(id) {
		h = h*31 + int(c)
	}
	return (h%hotAccounts + hotAccounts) % hotAccounts
}

// vmHWM is this process's resident high-water mark in bytes.
func vmHWM() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return -1
}

// startWorker runs this test binary as a worker process of mode on e's
// queue and schema, and returns it (its stdout is collected).
func (e *env) startWorker(mode string, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_TEST_WORKER="+mode, "IDEM_TEST_QUEUE="+e.queue, "IDEM_TEST_SCHEMA="+e.tables.Schema)
	cmd.Env = append(cmd.Env, extra...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	require.NoError(e.t, cmd.Start())
	e.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &out
}

// A message that kills its worker process (os.Exit in the handler), under a
// supervisor that restarts the worker, takes only itself down: every
// healthy message of its window is processed once, none is dead-lettered
// (by idem or by the broker's delivery limit), and the poison message is
// dead-lettered by idem as worker_crashed, with a row carrying its id.
func TestPoisonMessageThatKillsItsWorkerTakesOnlyItselfDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	const healthy = 500
	for i := range healthy {
		e.publish(fmt.Sprintf("m-%d", i), `{}`, nil)
		if i == healthy/2 {
			e.publish("poison", `{}`, nil)
		}
	}
	finished := func() bool {
		q, err := e.ch.QueueDeclarePassive(e.queue+".dlq", true, false, false, false, nil)
		require.NoError(t, err)
		return q.Messages > 0 && len(e.effects()) == healthy
	}
	restarts := 0
	deadline := time.Now().Add(3 * time.Minute)
	for !finished() {
		require.True(t, time.Now().Before(deadline), "not settled after %d restarts", restarts)
		cmd, _ := e.startWorker("poison")
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
	supervise:
		for {
			select {
			case err := <-done:
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "the worker only dies on the poison message")
				require.Equal(t, 3, ee.ExitCode())
				restarts++
				require.LessOrEqual(t, restarts, 6, "the supervisor restarts the worker a bounded number of times")
				break supervise
			case <-time.After(200 * time.Millisecond):
				if finished() {
					time.Sleep(500 * time.Millisecond) // let the last acks go out
					_ = cmd.Process.Kill()
					<-done
					break supervise
				}
			}
		}
	}
	eff := e.effects()
	require.Len(t, eff, healthy)
	for id, n := range eff {
		require.Equal(t, 1, n, "message %s applied %d times", id, n)
	}
	dlq := e.drain(e.queue + ".dlq")
	require.Len(t, dlq, 1, "only the poison message is dead-lettered")
	require.Equal(t, "poison", dlq[0].MessageId)
	require.Equal(t, deadletters.ReasonWorkerCrashed, dlq[0].Headers["x-idem-reason"])
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+e.tables.Table("dead_letters")+
		` WHERE message_id = 'poison' AND reason = 'worker_crashed'`))
}

// Large messages do not blow up memory: 40 queued messages of 15 MiB keep
// a fresh worker's resident high-water mark under 400 MiB, because what it
// holds of unsettled deliveries is bounded in bytes (MaxBufferedBytes), not
// only in count (Prefetch).
func TestLargeMessagesKeepResidentMemoryBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(func(cfg *Config) { cfg.QueueType = "classic" })
	body := bytes.Repeat([]byte("x"), 15<<20)
	pub := testbroker.Channel(t)
	for i := range 40 {
		require.NoError(t, pub.PublishWithContext(context.Background(), "", e.queue, false, false,
			amqp.Publishing{MessageId: fmt.Sprintf("big-%d", i), Body: body, DeliveryMode: amqp.Transient}))
	}
	cmd, out := e.startWorker("memory", "IDEM_TEST_EXPECT=40", "IDEM_TEST_QUEUE_TYPE=classic")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(3 * time.Minute):
		t.Fatal("the worker did not process the 40 messages")
	}
	var hwm int64
	_, err := fmt.Sscanf(strings.TrimSpace(out.String()), "vmhwm=%d", &hwm)
	require.NoError(t, err, "worker output: %q", out.String())
	t.Logf("worker VmHWM: %d MiB", hwm>>20)
	require.Positive(t, hwm)
	require.Less(t, hwm, int64(400<<20), "resident high-water mark")
	require.Len(t, e.effects(), 40)
}

// Three worker processes with one Name on one queue, whose handlers update
// the same 20 hot rows in no particular order, with 30% of the messages
// published twice in a row (the copies race in different processes), drain
// the queue exactly once without stalling: a conflict between batches costs
// a lock_timeout and a smaller retry, not PostgreSQL's one-second
// deadlock_timeout per batch. (BENCHMARKS.md compares one process and three.)
func TestCompetingProcessesOnHotRowsDrainExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare(nil)
	_, err := e.pool.Exec(context.Background(), `CREATE TABLE `+e.tables.QuotedSchema()+`.accounts (id int PRIMARY KEY, balance bigint NOT NULL)`)
	require.NoError(t, err)
	_, err = e.pool.Exec(context.Background(), `INSERT INTO `+e.tables.QuotedSchema()+`.accounts SELECT g, 0 FROM generate_series(0, $1 - 1) g`, hotAccounts)
	require.NoError(t, err)
	const n = 3000
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		e.publish(id, `{}`, nil)
		if i%10 < 3 {
			e.publish(id, `{}`, nil) // an adjacent duplicate
		}
	}
	started := time.Now()
	for range 3 {
		e.startWorker("hot")
	}
	waitFor(t, 90*time.Second, "the queue drained", func() bool { return len(e.effects()) == n })
	t.Logf("3 processes drained %d messages (+%d duplicates) in %s", n, n*3/10, time.Since(started).Round(time.Millisecond))
	for id, c := range e.effects() {
		require.Equal(t, 1, c, "message %s applied %d times", id, c)
	}
	require.Equal(t, n, e.count(`SELECT sum(balance)::int FROM `+e.tables.QuotedSchema()+`.accounts`))
}
