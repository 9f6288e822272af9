package partlease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// world records which process consumes which partition, and whether two
// ever consumed one partition at once.
type world struct {
	mu      sync.Mutex
	holders map[int][]string // partition → processes consuming it now
	overlap []string
}

func newWorld() *world { return &world{holders: map[int][]string{}} }

// consume is process name's consume function.
func (w *world) consume(name string) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		w.mu.Lock()
		w.holders[i] = append(w.holders[i], name)
		if len(w.holders[i]) > 1 {
			w.overlap = append(w.overlap, fmt.Sprintf("partition %d: %v", i, w.holders[i]))
		}
		w.mu.Unlock()
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // draining in-flight work
		w.mu.Lock()
		for k, n := range w.holders[i] {
			if n == name {
				w.holders[i] = append(w.holders[i][:k], w.holders[i][k+1:]...)
				break
			}
		}
		w.mu.Unlock()
		return nil
	}
}

// shares returns how many partitions each process consumes, and how many
// partitions have a consumer.
func (w *world) shares() (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out, covered := map[string]int{}, 0
	for _, hs := range w.holders {
		for _, h := range hs {
			out[h]++
		}
		if len(hs) > 0 {
			covered++
		}
	}
	return out, covered
}

// process is one lease running until stopped.
type process struct {
	lease *Lease
	stop  func()
}

func start(t *testing.T, key string, n int, w *world, name string) *process {
	t.Helper()
	pool := testdb.Pool(t)
	l, err := New(Config{Key: key, Partitions: n, Conn: pool.Config().ConnConfig, Interval: 100 * time.Millisecond,
		Logger: testrun.Logger()})
	require.NoError(t, err)
	return &process{lease: l, stop: testrun.Start(t, func(ctx context.Context) error { return l.Run(ctx, w.consume(name)) })}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond() {
		if time.Since(began) > limit {
			t.Fatalf("not %s within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(began)
}

// balanced reports that every partition has one consumer and each of the
// named processes consumes at least min.
func balanced(w *world, n, min int, names ...string) func() bool {
	return func() bool {
		shares, covered := w.shares()
		if covered != n {
			return false
		}
		for _, name := range names {
			if shares[name] < min {
				return false
			}
		}
		return true
	}
}

func TestThreeProcessesShareEightPartitionsAndEachHoldsTwoOrThree(t *testing.T) {
	t.Parallel()
	key, w := testdb.Name(t, "lease"), newWorld()
	for _, name := range []string{"a", "b", "c"} {
		start(t, key, 8, w, name)
	}
	waitFor(t, 15*time.Second, "balanced", balanced(w, 8, 2, "a", "b", "c"))
	time.Sleep(500 * time.Millisecond) // a few more turns: the share is stable
	shares, covered := w.shares()
	require.Equal(t, 8, covered)
	for name, n := range shares {
		require.True(t, n == 2 || n == 3, "%s holds %d partitions", name, n)
	}
	require.Empty(t, w.overlap, "no partition is consumed by two processes at once")
}

// A process that joins gets its share from the others, each partition
// stopped where it was before it starts in the new process; one that
// leaves hands its partitions over.
func TestJoiningAndLeavingProcessesMovePartitionsWithoutOverlap(t *testing.T) {
	t.Parallel()
	key, w := testdb.Name(t, "lease"), newWorld()
	a := start(t, key, 8, w, "a")
	waitFor(t, 10*time.Second, "a holds all", balanced(w, 8, 8, "a"))
	start(t, key, 8, w, "b")
	waitFor(t, 10*time.Second, "b holds its share", balanced(w, 8, 4, "a", "b"))
	start(t, key, 8, w, "c")
	waitFor(t, 10*time.Second, "c holds its share", balanced(w, 8, 2, "a", "b", "c"))

	a.stop()
	took := waitFor(t, 10*time.Second, "a's partitions taken over", balanced(w, 8, 4, "b", "c"))
	t.Logf("a's partitions taken over %s after it left", took.Round(time.Millisecond))
	require.Empty(t, w.overlap, "no partition is consumed by two processes at once")
}

// A process whose session dies (its backend terminated, as a failover or
// a cut would) stops consuming its partitions at its next turn and joins
// again with a new session; the partitions are shared again.
func TestAProcessWhoseSessionDiesStopsItsPartitionsAndJoinsAgain(t *testing.T) {
	t.Parallel()
	key, w := testdb.Name(t, "lease"), newWorld()
	a := start(t, key, 4, w, "a")
	waitFor(t, 10*time.Second, "a holds all", balanced(w, 4, 4, "a"))
	start(t, key, 4, w, "b")
	waitFor(t, 10*time.Second, "balanced", balanced(w, 4, 2, "a", "b"))

	pid := a.lease.pid.Load()
	require.NotZero(t, pid)
	var ok bool
	require.NoError(t, testdb.Pool(t).QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(t, ok)
	took := waitFor(t, 10*time.Second, "a back with a new session", func() bool {
		p := a.lease.pid.Load()
		return p != 0 && p != pid
	})
	t.Logf("a stopped its partitions and joined again %s after its session died", took.Round(time.Millisecond))
	took = waitFor(t, 10*time.Second, "every partition consumed again, shared", balanced(w, 4, 2, "a", "b"))
	t.Logf("balanced again %s later", took.Round(time.Millisecond))
}

// A consume that fails while its partition is held ends Run with its
// error, once the others stopped.
func TestAConsumeErrorEndsRun(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	l, err := New(Config{Key: testdb.Name(t, "lease"), Partitions: 3, Conn: pool.Config().ConnConfig, Interval: 50 * time.Millisecond})
	require.NoError(t, err)
	boom := errors.New("queue deleted")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = l.Run(ctx, func(ctx context.Context, i int) error {
		if i == 1 {
			return boom
		}
		<-ctx.Done()
		return nil
	})
	require.ErrorIs(t, err, boom)
	require.NoError(t, ctx.Err(), "Run returned at once, not at the deadline")
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Partitions: 2})
	require.Error(t, err)
}

// The lease session asks the server to probe it when idle, so that a
// process whose host is lost (no FIN, no RST) loses its locks in seconds,
// not after the kernel's two hours; a setting the application chose stays.
func TestTheLeaseSessionIsProbedByTheServerUnlessConfiguredOtherwise(t *testing.T) {
	t.Parallel()
	cfg := testdb.Pool(t).Config().ConnConfig.Copy()
	cfg.RuntimeParams["tcp_keepalives_count"] = "5"
	l, err := New(Config{Key: testdb.Name(t, "lease"), Partitions: 1, Conn: cfg})
	require.NoError(t, err)
	conn, err := l.connect(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	got := map[string]string{}
	for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"} {
		var v string
		require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v))
		got[name] = v
	}
	require.Equal(t, map[string]string{"tcp_keepalives_idle": "3", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "5"}, got)
}

// A process frozen with its partitions (SIGSTOP, a paused VM) sends no
// statement: the server ends its idle session after ten intervals, and
// with it the locks, so that the others take its partitions. (The kernel
// of a frozen process still answers keepalives.)
func TestTheServerEndsTheSessionOfAFrozenProcess(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	l, err := New(Config{Key: testdb.Name(t, "lease"), Partitions: 1, Conn: pool.Config().ConnConfig,
		Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	conn, err := l.connect(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var limit string
	require.NoError(t, conn.QueryRow(ctx, `SHOW idle_session_timeout`).Scan(&limit))
	require.Equal(t, "1s", limit, "ten intervals")
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, l.keys[0])
	require.NoError(t, err)
	pid := conn.PgConn().PID()

	// Frozen: the session runs nothing more.
	took := waitFor(t, 10*time.Second, "the frozen session's lock released", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	})
	t.Logf("the server ended the frozen session %s after its last statement", took.Round(time.Millisecond))
}
