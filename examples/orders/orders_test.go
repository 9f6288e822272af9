package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/ledger"
)

// argsEnv, when set, makes the test binary run the orders command with
// these arguments (separated by \x1f) instead of the tests: a worker process the
// standby test can kill.
const argsEnv = "ORDERS_TEST_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(argsEnv); args != "" {
		main2(strings.Split(args, "\x1f"))
		return
	}
	streamio.RouteClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(m.Run())
}

// main2 is main with the given arguments.
func main2(args []string) {
	os.Args = append([]string{"orders"}, args...)
	main()
}

// testEnv is one test's schema, stream and mail stub.
type testEnv struct {
	t    testing.TB
	o    options
	pool *pgxpool.Pool
	mail *mailbox
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	testdb.Pool(t) // skips (or fails under CI) without PostgreSQL
	ctx := context.Background()
	mail := newMailbox()
	srv := httptest.NewServer(mail.handler())
	t.Cleanup(srv.Close)
	logger := testrun.Logger()
	o := options{pgURL: testdb.URL(), amqpURL: testbroker.URL(), streamURL: streamio.URLFromEnv(), schema: testdb.Name(t, "o"),
		stream: testdb.Name(t, "orders"), mailURL: srv.URL + "/send", logger: logger}
	se, err := streamio.Open(ctx, streamio.Config{URI: o.streamURL})
	if err != nil {
		testdb.Unavailable(t, "RabbitMQ stream port", err)
	}
	t.Cleanup(func() {
		_ = se.DeleteStream(context.Background(), o.stream)
		_ = se.Close()
	})
	pool, err := setup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{o.schema}.Sanitize()+" CASCADE")
		pool.Close()
	})
	return &testEnv{t: t, o: o, pool: pool, mail: mail}
}

// row is a row of order_overview.
type row struct {
	OrderID, Status string
	Version         int
	UpdatedAt       time.Time
}

func (e *testEnv) rows() []row {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT order_id, status, version, updated_at FROM `+overviewTable(e.o)+` ORDER BY order_id`)
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(e.t, err)
	return out
}

// expected is each order's newest (status, version) in the published events.
func expected(sent []message) map[string]row {
	out := map[string]row{}
	for _, m := range sent {
		var ev event
		_ = json.Unmarshal(m.body, &ev)
		if cur, ok := out[ev.OrderID]; !ok || ev.Version > cur.Version {
			out[ev.OrderID] = row{OrderID: ev.OrderID, Status: statuses[ev.Type], Version: ev.Version}
		}
	}
	return out
}

// shipped counts the orders with an OrderShipped event.
func shipped(sent []message) int {
	orders := map[string]bool{}
	for _, m := range sent {
		var ev event
		_ = json.Unmarshal(m.body, &ev)
		if ev.Type == "OrderShipped" {
			orders[ev.OrderID] = true
		}
	}
	return len(orders)
}

func (e *testEnv) requireProjection(sent []message) {
	e.t.Helper()
	want := expected(sent)
	got := e.rows()
	require.Len(e.t, got, len(want))
	for _, r := range got {
		w := want[r.OrderID]
		require.Equal(e.t, [2]any{w.Status, w.Version}, [2]any{r.Status, r.Version}, "order %s", r.OrderID)
	}
}

func (e *testEnv) checkpoint() int64 {
	e.t.Helper()
	last, ok, err := store.Checkpoint(context.Background(), e.pool, idem.Tables{Schema: e.o.schema}, consumerName, e.o.stream)
	require.NoError(e.t, err)
	if !ok {
		return -1
	}
	return last
}

// publish publishes the events cfg describes and returns them.
func (e *testEnv) publish(cfg publishConfig) []message {
	e.t.Helper()
	msgs := events(cfg)
	n, err := publish(context.Background(), e.o, msgs)
	require.NoError(e.t, err)
	require.Equal(e.t, len(msgs), n)
	return msgs
}

// startWorker runs a worker (consumer and dispatcher) in this process until
// the returned stop is called.
func (e *testEnv) startWorker() (c *consumer.Consumer, stop func()) {
	e.t.Helper()
	overview, err := newOverview(e.o)
	require.NoError(e.t, err)
	c, err = newConsumer(e.o, e.pool, overview)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runWorker(ctx, e.o, e.pool, c) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(e.t, err)
			case <-time.After(30 * time.Second):
				e.t.Error("worker did not stop")
			}
		})
	}
	e.t.Cleanup(stop)
	return c, stop
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *testEnv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func TestRebuildReproducesTheLiveProjectionRowForRowAndSendsNoMail(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{"online": {"--mode", "rebuild"}, "in place": {"--mode", "rebuild", "--in-place"}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRebuildReproducesTheLiveProjection(t, args)
		})
	}
}

func testRebuildReproducesTheLiveProjection(t *testing.T, args []string) {
	e := newTestEnv(t)
	ctx := context.Background()
	sent := e.publish(publishConfig{n: 3000, dup: 0.05, swap: 0.02, seed: 7})
	tail := int64(len(sent) - 1)
	_, stop := e.startWorker()
	waitFor(t, 60*time.Second, "the live worker at the tail with every e-mail sent", func() bool {
		return e.checkpoint() == tail && e.mail.stats().Distinct == shipped(sent)
	})
	stop()
	live := e.rows()
	e.requireProjection(sent)
	for order, n := range e.mail.sent() {
		require.Equal(t, 1, n, "order %s got %d e-mails", order, n)
	}
	mailed := e.mail.stats()

	// A dispatcher keeps running during the rebuild: there must be nothing
	// for it to send.
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: e.pool, Tables: idem.Tables{Schema: e.o.schema},
		Logger: e.o.logger, PollInterval: 10 * time.Millisecond,
		Executors: map[string]ledger.Executor{notifyShipped: &ledger.HTTPExecutor{}}})
	require.NoError(t, err)
	dctx, stopDispatcher := context.WithCancel(ctx)
	dispatched := make(chan error, 1)
	go func() { dispatched <- d.Run(dctx) }()

	require.NoError(t, replayCommand(ctx, e.o, args))
	require.Equal(t, live, e.rows(), "the rebuilt projection differs from the live one")
	require.Equal(t, tail, e.checkpoint(), "the live consumer continues after the hand-off")
	require.Zero(t, e.count(`SELECT count(*) FROM `+idem.Tables{Schema: e.o.schema}.Table("ledger")+` WHERE status <> 'succeeded'`))
	stopDispatcher()
	require.NoError(t, <-dispatched)
	require.Equal(t, mailed, e.mail.stats(), "the mail stub received something during the rebuild")
}

func TestStandbyTakesOverWhenTheActiveWorkerIsKilled(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	ctx := context.Background()
	first := e.publish(publishConfig{n: 3000, dup: 0.05, swap: 0.02, seed: 11})

	// The active worker is another process, killed with SIGKILL.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), argsEnv+"="+strings.Join([]string{"-schema", e.o.schema, "-stream", e.o.stream,
		"-mail", e.o.mailURL, "worker"}, "\x1f"))
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	waitFor(t, 60*time.Second, "the active worker at the tail", func() bool { return e.checkpoint() == int64(len(first)-1) })

	standby, _ := e.startWorker()
	// More events; the active worker dies while it consumes them.
	more := events(publishConfig{n: 3000, dup: 0.05, swap: 0.02, seed: 12, first: 2000})
	published := make(chan error, 1)
	go func() {
		_, err := publish(ctx, e.o, more)
		published <- err
	}()
	waitFor(t, 60*time.Second, "the active worker consuming the new events", func() bool { return e.checkpoint() > int64(len(first)-1) })
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed = true
	require.NoError(t, <-published)

	all := append(first, more...)
	waitFor(t, 60*time.Second, "the standby at the tail", func() bool { return e.checkpoint() == int64(len(all)-1) })
	require.Positive(t, standby.Stats().Processed, "the standby never took over")
	e.requireProjection(all)
	require.Equal(t, shipped(all), e.count(`SELECT count(*) FROM `+idem.Tables{Schema: e.o.schema}.Table("ledger")+` WHERE effect_type = $1`, notifyShipped),
		"one e-mail effect per shipped order")
}

func TestRepairTouchesOnlyTheSelectedOrdersAndAuditsEachMessage(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	ctx := context.Background()
	sent := e.publish(publishConfig{n: 300, dup: 0.1, seed: 3})
	_, stop := e.startWorker()
	waitFor(t, 60*time.Second, "the live worker at the tail", func() bool { return e.checkpoint() == int64(len(sent)-1) })
	stop()
	// Someone broke three rows by hand.
	_, err := e.pool.Exec(ctx, `UPDATE `+overviewTable(e.o)+` SET status = 'placed', version = 1 WHERE order_id IN ('o-1', 'o-2', 'o-3')`)
	require.NoError(t, err)

	require.NoError(t, replayCommand(ctx, e.o, []string{"--mode", "repair", "--order", "o-1,o-2",
		"--operator", "alice", "--reason", "rows edited by hand"}))
	want := expected(sent)
	for _, r := range e.rows() {
		w := want[r.OrderID]
		if r.OrderID == "o-3" {
			require.Equal(t, [2]any{"placed", 1}, [2]any{r.Status, r.Version}, "an order that was not selected was repaired")
			continue
		}
		require.Equal(t, [2]any{w.Status, w.Version}, [2]any{r.Status, r.Version}, "order %s", r.OrderID)
	}
	selected := 0
	for _, m := range sent {
		if strings.HasPrefix(m.id, "evt-o-1-") || strings.HasPrefix(m.id, "evt-o-2-") {
			selected++
		}
	}
	audit := idem.Tables{Schema: e.o.schema}.Table("replay_audit")
	require.Equal(t, selected, e.count(`SELECT count(*) FROM `+audit+` WHERE operator = 'alice' AND reason = 'rows edited by hand'`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+audit+` WHERE business_key NOT IN ('o-1', 'o-2')`))
}
