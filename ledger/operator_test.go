package ledger_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/ledger"
)

// unknownEffect records an effect whose only call ends unknown.
func unknownEffect(t *testing.T, f *fixture, key string) ledger.Entry {
	t.Helper()
	e := f.record(t, context.Background(), ledger.Effect{Type: "pay", BusinessKey: key, Request: []byte(`{}`)})[0]
	return f.waitFor(t, e.ID, status(ledger.StatusUnknown))
}

func TestResolveIsAudited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	var calls atomic.Int32
	ex := funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		if calls.Add(1) == 1 {
			return ledger.Result{Status: ledger.StatusUnknown}, errTest
		}
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}, Concurrency: 1})
	a := unknownEffect(t, f, "a")

	list, err := f.ledger.List(ctx, ledger.Filter{Status: ledger.StatusUnknown})
	require.NoError(t, err)
	require.Len(t, list, 1)

	_, err = f.ledger.Resolve(ctx, a.ID, ledger.Resolution{As: ledger.StatusSucceeded, Operator: "alice"})
	require.Error(t, err, "a reason is required")

	// The operator checked with the provider: the capture did not happen.
	got, err := f.ledger.Resolve(ctx, a.ID, ledger.Resolution{As: ledger.StatusPending, Reason: "not in provider dashboard", Operator: "alice"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusPending, got.Status)
	done := f.waitFor(t, a.ID, status(ledger.StatusSucceeded))
	require.Equal(t, a.IdempotencyKey, done.IdempotencyKey)
	require.Equal(t, 1, done.AttemptCount, "a resolved retry starts a fresh attempt budget; the audit keeps the history")

	history, err := f.ledger.History(ctx, a.ID)
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, "alice", history[0].Operator)
	require.Equal(t, ledger.StatusUnknown, history[0].From)
	require.Equal(t, ledger.StatusPending, history[0].To)
	require.Equal(t, "not in provider dashboard", history[0].Reason)
	require.False(t, history[0].At.IsZero())

	stats, err := f.ledger.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[ledger.Status]int64{ledger.StatusSucceeded: 1}, stats.Counts)

	_, err = f.ledger.Resolve(ctx, a.ID, ledger.Resolution{As: ledger.StatusPending, Reason: "again", Operator: "alice"})
	require.ErrorIs(t, err, ledger.ErrNotResolvable, "a succeeded effect is never sent again")
}

func TestResolveRefusesEffectInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	ex := funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		close(started)
		<-release
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
	e := f.record(t, ctx, ledger.Effect{Type: "pay", BusinessKey: "a", Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}})
	<-started
	_, err := f.ledger.Resolve(ctx, e.ID, ledger.Resolution{As: ledger.StatusFailedTerminal, Reason: "r", Operator: "bob"})
	require.ErrorIs(t, err, ledger.ErrInFlight)
	close(release)
	f.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	history, err := f.ledger.History(ctx, e.ID)
	require.NoError(t, err)
	require.Empty(t, history)
}

func TestGetUnknownIDIsNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.ledger.Get(context.Background(), "nope")
	require.ErrorIs(t, err, ledger.ErrNotFound)
	_, err = f.ledger.Resolve(context.Background(), "nope", ledger.Resolution{As: ledger.StatusSucceeded, Reason: "r", Operator: "o"})
	require.ErrorIs(t, err, ledger.ErrNotFound)
}
