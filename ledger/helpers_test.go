package ledger_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// fixture is a fresh schema with a Ledger on it.
type fixture struct {
	pool   *pgxpool.Pool
	tables idem.Tables
	ledger *ledger.Ledger
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	require.NoError(t, err)
	return &fixture{pool: pool, tables: tables, ledger: l}
}

// record records effects in one committed transaction.
func (f *fixture) record(t testing.TB, ctx context.Context, effects ...ledger.Effect) []ledger.Entry {
	t.Helper()
	var out []ledger.Entry
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for _, e := range effects {
			entry, err := f.ledger.Record(ctx, tx, e)
			if err != nil {
				return err
			}
			out = append(out, entry)
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// dispatch starts a dispatcher on the fixture's tables with tiny backoffs
// and stops it when the test ends. cfg's zero fields get test defaults.
func (f *fixture) dispatch(t testing.TB, cfg ledger.DispatcherConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := f.start(t, ctx, cfg)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-stopped)
	})
}

// start runs a dispatcher until ctx ends; the channel yields Run's result.
func (f *fixture) start(t testing.TB, ctx context.Context, cfg ledger.DispatcherConfig) <-chan error {
	t.Helper()
	cfg.Pool, cfg.Tables = f.pool, f.tables
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
	}
	if cfg.RetryBackoffMax == 0 {
		cfg.RetryBackoffMax = 5 * time.Millisecond
	}
	d, err := ledger.NewDispatcher(cfg)
	require.NoError(t, err)
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	return stopped
}

// waitFor polls the entry with id until ok accepts it, or fails the test
// after 15 seconds.
func (f *fixture) waitFor(t testing.TB, id string, ok func(ledger.Entry) bool) ledger.Entry {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		e, err := f.ledger.Get(context.Background(), id)
		require.NoError(t, err)
		if ok(e) {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("effect %s: condition not met before the deadline; last seen %+v", id, e)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func status(s ledger.Status) func(ledger.Entry) bool {
	return func(e ledger.Entry) bool { return e.Status == s }
}

// target is an httptest server that records the idempotency keys it
// receives and answers with respond.
type target struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string
}

func newTarget(t testing.TB, respond func(w http.ResponseWriter, r *http.Request, n int)) *target {
	t.Helper()
	tg := &target{}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		tg.keys = append(tg.keys, r.Header.Get("Idempotency-Key"))
		n := len(tg.keys)
		tg.mu.Unlock()
		respond(w, r, n)
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) received() []string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]string(nil), tg.keys...)
}

func ok(w http.ResponseWriter, _ *http.Request, _ int) {
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"ok":true}`))
}

// funcExecutor is an Executor from a function, for tests that need to
// control the outcome or block a call.
type funcExecutor struct {
	dedup bool
	fn    func(ctx context.Context, c ledger.Call) (ledger.Result, error)
}

func (e funcExecutor) Execute(ctx context.Context, c ledger.Call) (ledger.Result, error) {
	return e.fn(ctx, c)
}

func (e funcExecutor) DeduplicatesByKey() bool { return e.dedup }

var errTest = errors.New("test failure")
