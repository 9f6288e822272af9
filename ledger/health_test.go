package ledger_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/ledger"
)

func noop() map[string]ledger.Executor {
	return map[string]ledger.Executor{"x": funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}}
}

func TestDispatcherHealthFollowsItsRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: f.pool, Tables: f.tables, Executors: noop(),
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var _ health.Reporter = d

	s := d.Health()
	require.Equal(t, health.Status{Component: "ledger dispatcher", Live: true, Reason: "not started"}, s)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Eventually(t, func() bool { return d.Health().Ready }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, health.Status{Component: "ledger dispatcher", Ready: true, Live: true}, d.Health())

	cancel()
	require.NoError(t, <-done)
	require.Equal(t, health.Status{Component: "ledger dispatcher", Reason: "stopped"}, d.Health())
}

func TestDispatcherWithoutItsDatabaseIsLiveButNotReady(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://root@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: pool, Executors: noop(),
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool { return strings.Contains(d.Health().Reason, "database:") }, 10*time.Second, 10*time.Millisecond)
	s := d.Health()
	require.False(t, s.Ready)
	require.True(t, s.Live, "waiting for the database is not being wedged: %s", s.Reason)
	require.Contains(t, s.Reason, "not listening for notifications")
}

func TestDispatcherWarnsWhenAnEffectNeedsAnOperator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	entries := f.record(t, context.Background(),
		ledger.Effect{Type: "lost", BusinessKey: "b1", Request: []byte(`{}`)},
		ledger.Effect{Type: "refused", BusinessKey: "b2", Request: []byte(`{}`)},
		ledger.Effect{Type: "fine", BusinessKey: "b3", Request: []byte(`{}`)})
	answer := func(s ledger.Status, err error) ledger.Executor {
		return funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) { return ledger.Result{Status: s}, err }}
	}
	var logs testrun.LogBuffer
	f.dispatch(t, ledger.DispatcherConfig{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Executors: map[string]ledger.Executor{
			"lost":    answer(ledger.StatusUnknown, errTest),
			"refused": answer(ledger.StatusFailedTerminal, errTest),
			"fine":    answer(ledger.StatusSucceeded, nil),
		},
	})
	f.waitFor(t, entries[0].ID, status(ledger.StatusUnknown))
	f.waitFor(t, entries[1].ID, status(ledger.StatusFailedTerminal))
	f.waitFor(t, entries[2].ID, status(ledger.StatusSucceeded))
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "level=WARN") == 2 }, 10*time.Second, 10*time.Millisecond,
		"one warning per effect that needs an operator: %s", logs.String())
	out := logs.String()
	for _, want := range []string{
		`msg="ledger: effect outcome unknown; resolve it with idem ledger resolve" effect_id=` + entries[0].ID +
			` effect_type=lost status=unknown attempt=1 error="test failure"`,
		`msg="ledger: effect failed for good" effect_id=` + entries[1].ID +
			` effect_type=refused status=failed_terminal attempt=1 error="test failure"`,
	} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, entries[2].ID)
}
