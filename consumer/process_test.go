package consumer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testbroker"
)

var (
	buildWorker sync.Once
	workerBin   string
	workerErr   error
)

// workerBinary builds internal/testkit/testworker once per test binary, without the
// race detector (its instrumentation would distort resident memory).
func workerBinary(t *testing.T) string {
	t.Helper()
	buildWorker.Do(func() {
		dir, err := os.MkdirTemp("", "idem-testworker-")
		if err != nil {
			workerErr = err
			return
		}
		workerBin = filepath.Join(dir, "testworker")
		out, err := exec.Command("go", "build", "-o", workerBin, "github.com/idemkit/idem/internal/testkit/testworker").CombinedOutput()
		if err != nil {
			workerErr = fmt.Errorf("go build internal/testkit/testworker: %v: %s", err, out)
		}
	})
	if workerErr != nil {
		t.Fatal(workerErr)
	}
	return workerBin
}

// startWorker runs internal/testkit/testworker in mode on e's queue and schema, and
// returns it (its stdout is collected).
func (e *env) startWorker(mode string, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	e.t.Helper()
	args := append([]string{"-mode", mode, "-queue", e.queue, "-schema", e.tables.Schema}, extra...)
	cmd := exec.Command(workerBinary(e.t), args...)
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
	cmd, out := e.startWorker("memory", "-expect", "40", "-queue-type", "classic")
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
	_, err = e.pool.Exec(context.Background(), `INSERT INTO `+e.tables.QuotedSchema()+`.accounts SELECT g, 0 FROM generate_series(0, $1 - 1) g`, 20)
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
