package ledger_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/ledger"
)

// blockingFirstCall returns an executor whose first call blocks, ignoring
// its context, until release is closed (a process that hangs or died with
// the request in flight); later calls record their key and succeed.
func blockingFirstCall(dedup bool, started chan<- struct{}, release <-chan struct{}, keys *[]string, mu *sync.Mutex) funcExecutor {
	var calls atomic.Int32
	return funcExecutor{dedup: dedup, fn: func(_ context.Context, c ledger.Call) (ledger.Result, error) {
		mu.Lock()
		*keys = append(*keys, c.IdempotencyKey)
		mu.Unlock()
		if calls.Add(1) == 1 {
			close(started)
			<-release
			return ledger.Result{Status: ledger.StatusFailedTerminal}, errTest
		}
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
}

func TestDispatcherDyingInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		dedup bool
		want  ledger.Status
	}{
		{"NonDeduplicatingTargetBecomesUnknown", false, ledger.StatusUnknown},
		{"DeduplicatingTargetIsRetriedWithSameKey", true, ledger.StatusSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1", Request: []byte(`{}`)})[0]
			var (
				mu      sync.Mutex
				keys    []string
				started = make(chan struct{})
				release = make(chan struct{})
			)
			t.Cleanup(func() { close(release) })
			ex := blockingFirstCall(tc.dedup, started, release, &keys, &mu)
			cfg := ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"charge": ex}, Lease: 300 * time.Millisecond}

			// The first dispatcher claims the effect and dies with the call
			// in flight: Run gives up on the call when its lease ends, and
			// nothing writes its outcome.
			ctx, cancel := context.WithCancel(context.Background())
			first := f.start(t, ctx, cfg)
			<-started
			cancel()
			require.NoError(t, <-first)

			// Another dispatcher sweeps the expired lease.
			f.dispatch(t, cfg)
			got := f.waitFor(t, e.ID, status(tc.want))
			mu.Lock()
			defer mu.Unlock()
			if tc.dedup {
				require.Equal(t, []string{e.IdempotencyKey, e.IdempotencyKey}, keys)
				require.Equal(t, 2, got.AttemptCount)
			} else {
				require.Equal(t, []string{e.IdempotencyKey}, keys, "an unknown effect must not be retried blindly")
				require.Equal(t, "lease expired while in flight", got.LastError)
			}
		})
	}
}

func TestStaleOwnerOutcomeIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1", Request: []byte(`{}`)})[0]
	var (
		mu      sync.Mutex
		keys    []string
		started = make(chan struct{})
		release = make(chan struct{})
	)
	reader := sdkmetric.NewManualReader()
	ex := blockingFirstCall(true, started, release, &keys, &mu)
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:     map[string]ledger.Executor{"charge": ex},
		Lease:         300 * time.Millisecond,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	<-started
	// The lease expires, the effect is claimed again under a new owner token
	// and succeeds.
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	// Now the first claim's late outcome (failed_terminal) arrives.
	close(release)
	deadline := time.Now().Add(15 * time.Second)
	for counter(t, reader, "idem.ledger.outcomes_refused") < 1 {
		require.True(t, time.Now().Before(deadline), "the stale outcome was not reported as refused")
		time.Sleep(10 * time.Millisecond)
	}
	got, err := f.ledger.Get(context.Background(), e.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, got.Status)
	require.Empty(t, got.LastError)
}

// counter sums the data points of the int64 counter name.
func counter(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

func TestUnavailableWithRetryAfterIsRetriedUntilSuccess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		if n <= 2 {
			w.Header().Set("Retry-After", "0") // the origin says it is down: nothing was done
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	e := f.record(t, context.Background(), ledger.Effect{Type: "hook", BusinessKey: "b", Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"hook": &ledger.HTTPExecutor{}}})
	got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	require.Equal(t, 3, got.AttemptCount)
	require.Equal(t, []string{e.IdempotencyKey, e.IdempotencyKey, e.IdempotencyKey}, tg.received())
	require.False(t, got.CompletedAt.IsZero())
}

func TestConflictResponseIsTerminal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte("already captured differently"))
	})
	e := f.record(t, context.Background(), ledger.Effect{Type: "hook", BusinessKey: "b", Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"hook": &ledger.HTTPExecutor{}}})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedTerminal))
	require.Equal(t, 1, got.AttemptCount)
	require.Contains(t, got.LastError, "409")
	require.Equal(t, "already captured differently", string(got.Response))
	require.Len(t, tg.received(), 1)
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	e := f.record(t, context.Background(), ledger.Effect{Type: "hook", BusinessKey: "b", Target: tg.URL, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"hook": &ledger.HTTPExecutor{}}})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedRetryable))
	require.Equal(t, 1, got.AttemptCount)
	// The tiny configured backoff would be milliseconds; Retry-After wins.
	require.Greater(t, got.NextAttemptAt.Sub(got.CreatedAt), 100*time.Second)
	require.Len(t, tg.received(), 1)
}

func TestTimeoutAfterSendIsUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	release := make(chan struct{})
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select { // the request arrived; the answer never comes in time
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) })
	e := f.record(t, context.Background(), ledger.Effect{Type: "hook", BusinessKey: "b", Target: tg.URL, Request: []byte(`{}`)})[0]
	client := &http.Client{Timeout: 200 * time.Millisecond}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"hook": &ledger.HTTPExecutor{Client: client}}})
	got := f.waitFor(t, e.ID, status(ledger.StatusUnknown))
	require.Contains(t, got.LastError, "no answer after sending")
	require.Len(t, tg.received(), 1)
}

func TestConnectionRefusedIsRetryable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	e := f.record(t, context.Background(), ledger.Effect{Type: "hook", BusinessKey: "b", Target: url, Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{
		Executors:    map[string]ledger.Executor{"hook": &ledger.HTTPExecutor{}},
		RetryBackoff: time.Hour, RetryBackoffMax: time.Hour,
	})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedRetryable))
	require.Contains(t, got.LastError, "not sent")
	require.Equal(t, 1, got.AttemptCount)
}

func TestConcurrentDispatchersExecuteEachEffectExactlyOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 200
	var (
		mu      sync.Mutex
		calls   = map[string]int{}
		running = map[string]bool{}
		overlap atomic.Bool
	)
	ex := funcExecutor{fn: func(_ context.Context, c ledger.Call) (ledger.Result, error) {
		mu.Lock()
		if running[c.EffectID] {
			overlap.Store(true)
		}
		running[c.EffectID] = true
		calls[c.EffectID]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		running[c.EffectID] = false
		mu.Unlock()
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
	effects := make([]ledger.Effect, n)
	for i := range effects {
		effects[i] = ledger.Effect{Type: "work", BusinessKey: fmt.Sprint(i), Request: []byte(`{}`)}
	}
	cfg := ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"work": ex}, BatchSize: 10, Concurrency: 8}
	f.dispatch(t, cfg)
	f.dispatch(t, cfg)
	entries := f.record(t, context.Background(), effects...)
	for _, e := range entries {
		f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	}
	mu.Lock()
	defer mu.Unlock()
	require.False(t, overlap.Load(), "an effect was executed twice at the same time")
	require.Len(t, calls, n)
	for id, c := range calls {
		require.Equal(t, 1, c, "effect %s", id)
	}
}

func TestExecutorWithoutStatusCountsAsUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "odd", BusinessKey: "b", Request: []byte(`{}`)})[0]
	ex := funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) { return ledger.Result{}, errTest }}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"odd": ex}})
	got := f.waitFor(t, e.ID, status(ledger.StatusUnknown))
	require.Equal(t, errTest.Error(), got.LastError)
}

func TestRetryableEffectGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "flaky", BusinessKey: "b", Request: []byte(`{}`)})[0]
	ex := funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		return ledger.Result{Status: ledger.StatusFailedRetryable}, errTest
	}}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"flaky": ex}, MaxAttempts: 3})
	got := f.waitFor(t, e.ID, status(ledger.StatusFailedTerminal))
	require.Equal(t, 3, got.AttemptCount)
	require.True(t, strings.HasPrefix(got.LastError, "gave up after 3 attempts"), got.LastError)
}

// reconcilingExecutor answers every call with unknown and every lookup with
// what the target says it did.
type reconcilingExecutor struct {
	funcExecutor
	lookups atomic.Int32
}

func (e *reconcilingExecutor) Lookup(context.Context, ledger.Call) (ledger.Result, error) {
	e.lookups.Add(1)
	return ledger.Result{Status: ledger.StatusSucceeded, Response: []byte("found")}, nil
}

func TestReconcilerSettlesUnknownEffect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "pay", BusinessKey: "b", Request: []byte(`{}`)})[0]
	ex := &reconcilingExecutor{funcExecutor: funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		return ledger.Result{Status: ledger.StatusUnknown}, errTest
	}}}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}, ReconcileInterval: time.Millisecond})
	got := f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	require.Equal(t, "found", string(got.Response))
	require.Equal(t, 1, got.AttemptCount, "a lookup is not an attempt")
	require.GreaterOrEqual(t, ex.lookups.Load(), int32(1))
}

func TestShutdownWaitsForCallsInFlightAndWritesTheirOutcomes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "charge", BusinessKey: "o-1", Request: []byte(`{}`)})[0]
	started, release := make(chan struct{}), make(chan struct{})
	ex := funcExecutor{fn: func(ctx context.Context, _ ledger.Call) (ledger.Result, error) {
		close(started)
		<-release
		// Shutdown does not cancel the call: the request may be on the wire.
		return ledger.Result{Status: ledger.StatusSucceeded}, ctx.Err()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := f.start(t, ctx, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"charge": ex}})
	<-started
	cancel()
	select {
	case <-stopped:
		t.Fatal("Run returned while a call was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	got, err := f.ledger.Get(context.Background(), e.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, got.Status)
	require.Empty(t, got.LastError)
}

// failingLookup answers every call with unknown and every lookup with a
// failed query that also says "not sent", as an executor's own convention
// for a refused connection might.
type failingLookup struct {
	funcExecutor
	lookups atomic.Int32
}

func (e *failingLookup) Lookup(context.Context, ledger.Call) (ledger.Result, error) {
	e.lookups.Add(1)
	return ledger.Result{Status: ledger.StatusFailedRetryable}, errTest
}

// A lookup that fails says nothing of the request: the effect stays
// unknown and is never sent again on its word.
func TestAFailedLookupLeavesTheEffectUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.record(t, context.Background(), ledger.Effect{Type: "pay", BusinessKey: "b", Request: []byte(`{}`)})[0]
	var calls atomic.Int32
	ex := &failingLookup{funcExecutor: funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		calls.Add(1)
		return ledger.Result{Status: ledger.StatusUnknown}, errTest
	}}}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}, ReconcileInterval: time.Millisecond})
	require.Eventually(t, func() bool { return ex.lookups.Load() >= 3 }, 15*time.Second, 5*time.Millisecond)
	// Between lookups the effect is unknown; during one, a reconciler holds
	// it (in_flight).
	require.Eventually(t, func() bool {
		got, err := f.ledger.Get(context.Background(), e.ID)
		require.NoError(t, err)
		require.Contains(t, []ledger.Status{ledger.StatusUnknown, ledger.StatusInFlight}, got.Status)
		return got.Status == ledger.StatusUnknown
	}, 5*time.Second, time.Millisecond, "unknown between lookups")
	require.Equal(t, int32(1), calls.Load(), "sent once, never again on a failed lookup's word")
}
