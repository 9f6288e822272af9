package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/replay"
)

// command returns the orders command with args for e's schema, stream and
// mail stub, as a process of its own (the test binary, see TestMain).
func (e *testEnv) command(args ...string) *exec.Cmd {
	all := append([]string{"-schema", e.o.schema, "-stream", e.o.stream, "-mail", e.o.mailURL}, args...)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), argsEnv+"="+strings.Join(all, "\x1f"), "IDEM_PG_URL="+e.o.pgURL,
		"IDEM_AMQP_URL="+e.o.amqpURL, "IDEM_STREAM_URL="+e.o.streamURL)
	return cmd
}

// startProcess starts the orders command with args; it is stopped with
// SIGTERM when the test ends, if still running.
func (e *testEnv) startProcess(args ...string) *exec.Cmd {
	e.t.Helper()
	cmd := e.command(args...)
	require.NoError(e.t, cmd.Start())
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	return cmd
}

// overviewReader polls the row count of order_overview, as a dashboard
// does, and remembers errors and any count smaller than one seen before.
type overviewReader struct {
	mu        sync.Mutex
	polls     int
	max       int
	errs      []string
	decreases []string
	stop      func()
}

func (e *testEnv) startReader() *overviewReader {
	r := &overviewReader{max: -1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var n int
			err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+overviewTable(e.o)).Scan(&n)
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			r.polls++
			switch {
			case err != nil:
				r.errs = append(r.errs, err.Error())
			case n < r.max:
				r.decreases = append(r.decreases, fmt.Sprintf("%d rows after %d", n, r.max))
			default:
				r.max = n
			}
			r.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	r.stop = func() { cancel(); <-done }
	e.t.Cleanup(r.stop)
	return r
}

func TestOnlineRebuildBesideARunningWorkerNeverShrinksTheTable(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	sent := e.publish(publishConfig{n: 12000, dup: 0.03, swap: 0.02, seed: 21})
	e.startProcess("worker")
	waitFor(t, 120*time.Second, "the worker at the tail", func() bool { return e.checkpoint() == int64(len(sent)-1) })
	before := len(e.rows())
	reader := e.startReader()

	// More events go to the stream over AMQP while the rebuild runs: at most
	// 40 chunks, so that how much the worker has left to do after the swap
	// does not grow with how long the rebuild took on a busy machine.
	stopPublishing := make(chan struct{})
	published := make(chan []message, 1)
	go func() {
		var more []message
		for i := 0; ; i++ {
			if i == 40 {
				<-stopPublishing
				published <- more
				return
			}
			select {
			case <-stopPublishing:
				published <- more
				return
			case <-time.After(100 * time.Millisecond):
			}
			chunk := events(publishConfig{n: 150, dup: 0.03, swap: 0.02, seed: uint64(100 + i), first: 100000 + 1000*i})
			if _, err := publish(context.Background(), e.o, chunk); err != nil {
				t.Errorf("publish: %v", err)
				published <- more
				return
			}
			more = append(more, chunk...)
		}
	}()
	var out bytes.Buffer
	rebuild := e.command("replay", "--mode", "rebuild")
	rebuild.Stderr = &out
	err := rebuild.Run()
	close(stopPublishing)
	more := <-published
	require.NoError(t, err, "the rebuild failed:\n%s", out.String())
	require.NotEmpty(t, more, "nothing was published during the rebuild")
	require.Contains(t, out.String(), "swapped: the rebuilt tables replaced the live ones")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	t.Logf("%d events published during the rebuild; its last lines:\n%s", len(more), strings.Join(lines[max(len(lines)-5, 0):], "\n"))

	all := append(sent, more...)
	waitFor(t, 300*time.Second, "the worker at the tail", func() bool { return e.checkpoint() == int64(len(all)-1) })
	reader.stop()
	require.Empty(t, reader.errs, "the reader got errors (%d polls)", reader.polls)
	require.Empty(t, reader.decreases, "the reader saw order_overview shrink")
	require.GreaterOrEqual(t, reader.max, before)
	require.Greater(t, reader.polls, 20)
	e.requireProjection(all)
	waitFor(t, 60*time.Second, "one e-mail per shipped order", func() bool { return e.mail.stats().Distinct == shipped(all) })
	for order, n := range e.mail.sent() {
		require.Equal(t, 1, n, "order %s got %d e-mails", order, n)
	}
}

func TestRebuildKilledMidwayLeavesTheLiveTableAndIsAbandonedOrResumed(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	ctx := context.Background()
	sent := e.publish(publishConfig{n: 15000, dup: 0.03, swap: 0.02, seed: 31})
	_, stop := e.startWorker()
	waitFor(t, 300*time.Second, "the worker at the tail", func() bool { return e.checkpoint() == int64(len(sent)-1) })
	live := e.rows()
	shadowTable := pgx.Identifier{e.o.schema, "order_overview__idem_rebuild"}.Sanitize()
	runs := idem.Tables{Schema: e.o.schema}.Table("replay_runs")

	// killMidway starts a rebuild process and kills it (SIGKILL) while it
	// builds, then returns its run id.
	killMidway := func(args ...string) string {
		cmd := e.startProcess(append([]string{"replay", "--mode", "rebuild"}, args...)...)
		waitFor(t, 120*time.Second, "the rebuild building its shadow", func() bool {
			var n int
			err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+shadowTable).Scan(&n)
			return err == nil && n > 1000
		})
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		require.Equal(t, live, e.rows(), "the killed rebuild touched the live table")
		var id string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT run_id FROM `+runs+` WHERE status = 'running'`).Scan(&id))
		return id
	}
	first := killMidway()
	require.ErrorIs(t, replayCommand(ctx, e.o, []string{"--mode", "rebuild"}), replay.ErrRebuildPending,
		"a new rebuild starts while the killed one keeps its shadow")
	require.NoError(t, replayCommand(ctx, e.o, []string{"--mode", "rebuild", "--abandon", "--run-id", first}))
	require.Equal(t, live, e.rows())
	require.Equal(t, 0, e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'order_overview__idem_rebuild'`, e.o.schema))

	second := killMidway()
	require.NotEqual(t, first, second)
	require.NoError(t, replayCommand(ctx, e.o, []string{"--mode", "rebuild", "--run-id", second}))
	require.Equal(t, live, e.rows(), "the resumed rebuild differs from the live projection")
	stop()
	require.Equal(t, "finished", func() string {
		var s string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT status FROM `+runs+` WHERE run_id = $1`, second).Scan(&s))
		return s
	}())
}
