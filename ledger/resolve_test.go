package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/ledger"
)

// keySeq makes the business keys of recordAs unique.
var keySeq atomic.Int64

// recordAs records n new effects of type typ and puts them in status s, as a
// crash or the dispatcher would have left them.
func (f *fixture) recordAs(t *testing.T, typ string, s ledger.Status, n int) []string {
	t.Helper()
	ctx := context.Background()
	var effects []ledger.Effect
	for i := range n {
		effects = append(effects, ledger.Effect{Type: typ, BusinessKey: fmt.Sprintf("%s-%d", typ, keySeq.Add(1)),
			Consumer: "billing", MessageID: fmt.Sprintf("m-%d", i), Request: []byte(`{}`)})
	}
	var ids []string
	for _, e := range f.record(t, ctx, effects...) {
		ids = append(ids, e.ID)
	}
	_, err := f.pool.Exec(ctx, "UPDATE "+f.tables.Table("ledger")+
		" SET status = $2, attempt_count = 1 WHERE effect_id = ANY($1)", ids, string(s))
	require.NoError(t, err)
	return ids
}

// audits returns the audit rows of the effects, as "id operator from->to reason".
func (f *fixture) audits(t *testing.T) map[string][]string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT effect_id, operator, from_status, to_status, reason FROM "+
		f.tables.Table("ledger_audit")+" ORDER BY id")
	require.NoError(t, err)
	out := map[string][]string{}
	var id, op, from, to, reason string
	_, err = pgx.ForEachRow(rows, []any{&id, &op, &from, &to, &reason}, func() error {
		out[id] = append(out[id], fmt.Sprintf("%s %s->%s %s", op, from, to, reason))
		return nil
	})
	require.NoError(t, err)
	return out
}

func TestResolveManyAuditsEachEffectAndSaysWhyEachRefusalWasRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	unknown := f.recordAs(t, "pay", ledger.StatusUnknown, 2)
	done := f.recordAs(t, "pay.done", ledger.StatusSucceeded, 1)
	ids := []string{unknown[0], done[0], "never-recorded", unknown[1], unknown[0]}

	res, err := f.ledger.ResolveMany(ctx, ids, ledger.Resolution{As: ledger.StatusSucceeded, Reason: "INC-7: in the provider's report", Operator: "alice"})
	require.NoError(t, err)
	require.Len(t, res, 4, "an id given twice is resolved once")
	require.Equal(t, []string{unknown[0], done[0], "never-recorded", unknown[1]}, []string{res[0].ID, res[1].ID, res[2].ID, res[3].ID})

	for _, r := range []ledger.ResolveResult{res[0], res[3]} {
		require.True(t, r.Resolved(), "%s: %v", r.ID, r.Err)
		require.Equal(t, ledger.StatusUnknown, r.From)
		require.Equal(t, ledger.StatusSucceeded, r.Entry.Status)
	}
	require.ErrorIs(t, res[1].Err, ledger.ErrNotResolvable, "a succeeded effect is never resolved again")
	require.Equal(t, ledger.StatusSucceeded, res[1].From)
	require.ErrorIs(t, res[2].Err, ledger.ErrNotFound)
	require.Empty(t, res[2].From)

	require.Equal(t, map[string][]string{
		unknown[0]: {"alice unknown->succeeded INC-7: in the provider's report"},
		unknown[1]: {"alice unknown->succeeded INC-7: in the provider's report"},
	}, f.audits(t), "one audit row per resolved effect, none for a refusal")

	_, err = f.ledger.ResolveMany(ctx, ids, ledger.Resolution{As: ledger.StatusSucceeded, Operator: "alice"})
	require.Error(t, err, "a reason is required")
}

func TestResolveManyRefusesAnEffectInFlightAndResolvesTheOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	ex := funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		close(started)
		<-release
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
	busy := f.record(t, ctx, ledger.Effect{Type: "pay", BusinessKey: "busy", Request: []byte(`{}`)})[0]
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}})
	<-started
	idle := f.recordAs(t, "refund", ledger.StatusUnknown, 1)[0] // no executor: nothing claims it

	res, err := f.ledger.ResolveMany(ctx, []string{busy.ID, idle}, ledger.Resolution{As: ledger.StatusFailedTerminal, Reason: "r", Operator: "bob"})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ledger.ErrInFlight)
	require.Equal(t, ledger.StatusInFlight, res[0].From)
	require.True(t, res[1].Resolved(), "%v", res[1].Err)
	close(release)
	f.waitFor(t, busy.ID, status(ledger.StatusSucceeded))
	require.Equal(t, map[string][]string{idle: {"bob unknown->failed_terminal r"}}, f.audits(t))
}

// A worker's transaction that holds an effect and moves it on commits
// first; the operator's resolution, waiting for it, then sees the new
// status and refuses: it never overwrites a newer change.
func TestResolutionWaitsForAWorkersUpdateAndNeverOverwritesIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	id := f.recordAs(t, "pay", ledger.StatusUnknown, 1)[0]

	worker, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = worker.Rollback(ctx) }()
	var pid int
	require.NoError(t, worker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	// A reconciler's lookup found the effect: it moves it, guarded.
	tag, err := worker.Exec(ctx, "UPDATE "+f.tables.Table("ledger")+
		" SET status = 'succeeded', completed_at = now() WHERE effect_id = $1 AND status = 'unknown'", id)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	done := make(chan []ledger.ResolveResult, 1)
	go func() {
		res, err := f.ledger.ResolveMany(ctx, []string{id}, ledger.Resolution{As: ledger.StatusPending, Reason: "send again", Operator: "alice"})
		if err != nil {
			res = []ledger.ResolveResult{{ID: id, Err: err}}
		}
		done <- res
	}()
	require.Eventually(t, func() bool { // the resolution waits for the worker's lock
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid).Scan(&n))
		return n == 1
	}, 15*time.Second, 10*time.Millisecond)
	require.NoError(t, worker.Commit(ctx))

	res := <-done
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, ledger.ErrNotResolvable, "the worker's succeeded stands")
	require.Equal(t, ledger.StatusSucceeded, res[0].From)
	e, err := f.ledger.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, e.Status)
	require.Empty(t, f.audits(t))
}

func TestResolveWhereResolvesOnlyWhatItListsPageByPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	pay := f.recordAs(t, "pay", ledger.StatusUnknown, 25)
	other := f.recordAs(t, "refund", ledger.StatusUnknown, 3)
	pending := f.recordAs(t, "pay.later", ledger.StatusPending, 2)
	first, err := f.ledger.List(ctx, ledger.Filter{Status: ledger.StatusUnknown, Type: "pay", Limit: 10})
	require.NoError(t, err)
	moved := first[9].ID // on the first page, moved on by a worker after it was listed
	var late string

	var results []ledger.ResolveResult
	err = f.ledger.ResolveWhere(ctx, ledger.Filter{Status: ledger.StatusUnknown, Type: "pay", Limit: 10},
		ledger.Resolution{As: ledger.StatusFailedTerminal, Reason: "never reached the provider", Operator: "carol"},
		func(r ledger.ResolveResult) {
			if len(results) == 0 {
				_, err := f.pool.Exec(ctx, "UPDATE "+f.tables.Table("ledger")+" SET status = 'pending' WHERE effect_id = $1", moved)
				require.NoError(t, err)
				late = f.recordAs(t, "pay", ledger.StatusUnknown, 1)[0] // recorded after ResolveWhere started
			}
			results = append(results, r)
		})
	require.NoError(t, err)
	require.Len(t, results, 25, "every effect listed, none recorded after the start")
	resolved := map[string]bool{}
	for _, r := range results {
		if r.ID == moved {
			require.ErrorIs(t, r.Err, ledger.ErrNotResolvable, "it is pending now, no longer unknown")
			require.Equal(t, ledger.StatusPending, r.From)
			continue
		}
		require.True(t, r.Resolved(), "%s: %v", r.ID, r.Err)
		resolved[r.ID] = true
	}
	require.Len(t, resolved, 24)
	for _, id := range pay {
		require.Equal(t, id != moved, resolved[id], id)
	}
	audits := f.audits(t)
	require.Len(t, audits, 24)
	for id := range resolved {
		require.Equal(t, []string{"carol unknown->failed_terminal never reached the provider"}, audits[id])
	}
	for _, id := range append(append(other, pending...), late) {
		e, err := f.ledger.Get(ctx, id)
		require.NoError(t, err)
		require.NotEqual(t, ledger.StatusFailedTerminal, e.Status, "%s was outside the filter", id)
	}
}

func TestResolveWhereRefusesAFilterWithoutAResolvableStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.recordAs(t, "pay", ledger.StatusUnknown, 1)
	r := ledger.Resolution{As: ledger.StatusSucceeded, Reason: "r", Operator: "o"}
	require.ErrorContains(t, f.ledger.ResolveWhere(ctx, ledger.Filter{Type: "pay"}, r, nil), "a status is required")
	require.ErrorIs(t, f.ledger.ResolveWhere(ctx, ledger.Filter{Status: ledger.StatusSucceeded}, r, nil), ledger.ErrNotResolvable)
	require.Empty(t, f.audits(t))
}

func TestListPagesNeitherRepeatNorSkipWhileEffectsAreRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	want := f.recordAs(t, "pay", ledger.StatusUnknown, 7)
	var got []string
	filter := ledger.Filter{Status: ledger.StatusUnknown, Limit: 3}
	for page := 0; ; page++ {
		entries, err := f.ledger.List(ctx, filter)
		require.NoError(t, err)
		for _, e := range entries {
			got = append(got, e.ID)
		}
		if page == 0 {
			want = append(want, f.recordAs(t, "refund", ledger.StatusUnknown, 1)...) // recorded later: on a later page
		}
		if len(entries) < filter.Limit {
			break
		}
		filter.After = entries[len(entries)-1].Cursor()
	}
	require.ElementsMatch(t, want, got)
	require.Len(t, got, len(want), "no entry twice")

	_, err := f.ledger.List(ctx, ledger.Filter{After: "not-a-cursor"})
	require.ErrorContains(t, err, "not a cursor")
}
