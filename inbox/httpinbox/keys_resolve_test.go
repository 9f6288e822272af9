package httpinbox_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// keyAudits returns the audit rows of the keys, as "operator from->to reason".
func (f *fixture) keyAudits() map[string][]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT encode(key_id, 'hex'), operator, from_state, to_state, reason FROM `+
		f.tables.Table("http_keys_audit")+` ORDER BY id`)
	require.NoError(f.t, err)
	out := map[string][]string{}
	var id, op, from, to, reason string
	_, err = pgx.ForEachRow(rows, []any{&id, &op, &from, &to, &reason}, func() error {
		out[id] = append(out[id], fmt.Sprintf("%s %s->%s %s", op, from, to, reason))
		return nil
	})
	require.NoError(f.t, err)
	return out
}

func keyOf(key string) string { return httpinbox.KeyID("", "test-client", "payments.create", key) }

func TestResolveManyKeysAuditsEachAndSaysWhyEachRefusalWasRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	h := unknownHandler(f, &runs)
	post(h, "u1", `{}`)
	post(h, "u2", `{}`)
	require.Equal(t, http.StatusCreated, post(f.handler(httpinbox.Route{}), "done", `{"amount": 5}`).Code)
	ids := []string{keyOf("u1"), keyOf("done"), "not-a-key-id", keyOf("u2"), keyOf("u1")}

	res, err := f.keys().ResolveMany(context.Background(), ids, httpinbox.KeyResolution{
		As: httpinbox.KeyCompleted, Reason: "INC-7: the provider has them", Operator: "alice"})
	require.NoError(t, err)
	require.Len(t, res, 4, "an id given twice is resolved once")
	for _, r := range []httpinbox.KeyResolveResult{res[0], res[3]} {
		require.True(t, r.Resolved(), "%s: %v", r.KeyID, r.Err)
		require.Equal(t, httpinbox.KeyUnknown, r.From)
		require.Equal(t, httpinbox.KeyCompleted, r.Record.State)
	}
	require.ErrorIs(t, res[1].Err, httpinbox.ErrKeyNotResolvable, "a stored response is never thrown away")
	require.Equal(t, httpinbox.KeyCompleted, res[1].From)
	require.ErrorIs(t, res[2].Err, httpinbox.ErrKeyNotFound)
	require.Equal(t, map[string][]string{
		keyOf("u1"): {"alice unknown->completed INC-7: the provider has them"},
		keyOf("u2"): {"alice unknown->completed INC-7: the provider has them"},
	}, f.keyAudits(), "one audit row per resolved key, none for a refusal")
}

// A request running under a key holds its record in the handler's
// transaction: the operator's resolution of it is refused, the others go
// through, and the request's own outcome stands.
func TestResolveManyKeysRefusesAKeyWhoseRequestRunsAndResolvesTheOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	post(unknownHandler(f, &runs), "u1", `{}`)
	entered, release := make(chan struct{}), make(chan struct{})
	slow := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		close(entered)
		<-release
		return httpinbox.JSON(http.StatusCreated, map[string]string{"ok": "yes"})
	})
	done := make(chan int, 1)
	go func() { done <- post(slow, "busy", `{}`).Code }()
	<-entered

	res, err := f.keys().ResolveMany(context.Background(), []string{keyOf("busy"), keyOf("u1")},
		httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "hand back", Operator: "bob"})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, httpinbox.ErrKeyInFlight)
	require.True(t, res[1].Resolved(), "%v", res[1].Err)
	close(release)
	require.Equal(t, http.StatusCreated, <-done)
	require.Equal(t, "completed", f.state("busy"), "the request's outcome stands")
	require.Equal(t, map[string][]string{keyOf("u1"): {"bob unknown->started hand back"}}, f.keyAudits())
}

func TestResolveWhereKeysResolvesOnlyWhatItListsPageByPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var runs atomic.Int64
	h := unknownHandler(f, &runs)
	for i := range 12 {
		post(h, fmt.Sprintf("u%d", i), `{}`)
	}
	other := f.m.Handle(httpinbox.Route{Operation: "refunds.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		return httpinbox.Unknown(httpinbox.Problem(http.StatusGatewayTimeout, "PROVIDER_TIMEOUT", "outcome unknown")), nil
	})
	post(other, "r1", `{}`)
	keys := f.keys()
	ctx := context.Background()
	first, err := keys.List(ctx, httpinbox.KeyFilter{State: httpinbox.KeyUnknown, Operation: "payments.create", Limit: 5})
	require.NoError(t, err)
	raced := first[4].KeyID // listed, then resolved by another operator before its turn

	var results []httpinbox.KeyResolveResult
	err = keys.ResolveWhere(ctx, httpinbox.KeyFilter{State: httpinbox.KeyUnknown, Operation: "payments.create", Limit: 5},
		httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "never charged", Operator: "carol"},
		func(r httpinbox.KeyResolveResult) {
			if len(results) == 0 {
				// dave hands it back first: carol's hand-back would be a second one.
				_, err := keys.Resolve(ctx, raced, httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "not charged", Operator: "dave"})
				require.NoError(t, err)
				post(h, "late", `{}`) // an unknown outcome after ResolveWhere started
			}
			results = append(results, r)
		})
	require.NoError(t, err)
	require.Len(t, results, 12)
	for _, r := range results {
		if r.KeyID == raced {
			var resolved *httpinbox.ResolvedError
			require.ErrorAs(t, r.Err, &resolved, "the other operator's decision is named")
			require.Equal(t, "dave", resolved.Operator)
			continue
		}
		require.True(t, r.Resolved(), "%s: %v", r.KeyID, r.Err)
	}
	audits := f.keyAudits()
	require.Len(t, audits, 12, "11 of carol's and dave's")
	require.Equal(t, "unknown", f.state("late"), "created after the start")
	require.Equal(t, "unknown", f.state("r1"), "outside the filter")

	require.ErrorContains(t, keys.ResolveWhere(ctx, httpinbox.KeyFilter{Operation: "payments.create"},
		httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "r", Operator: "o"}, nil), "a state is required")
	require.ErrorIs(t, keys.ResolveWhere(ctx, httpinbox.KeyFilter{State: httpinbox.KeyCompleted},
		httpinbox.KeyResolution{As: httpinbox.KeyStarted, Reason: "r", Operator: "o"}, nil), httpinbox.ErrKeyNotResolvable)
	_, err = keys.List(ctx, httpinbox.KeyFilter{After: "nope"})
	require.ErrorContains(t, err, "not a cursor")
}
