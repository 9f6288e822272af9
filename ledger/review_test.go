package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/ledger"
)

// Confirms come back out of order when unroutable messages (confirmed at
// once) mix with persistent ones (confirmed after fsync); concurrent
// publishes must all finish, each with its own outcome.
func TestOutboxSurvivesOutOfOrderConfirms(t *testing.T) {
	t.Parallel()
	ch := testbroker.Channel(t)
	q := testbroker.Queue(t)
	_, err := ch.QueueDeclare(q, true, false, false, false, nil)
	require.NoError(t, err)
	ex := newOutbox(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[ledger.Status]int{}
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				key := q
				if (g+i)%2 == 0 {
					key = "no-such-queue-" + q
				}
				req, _ := json.Marshal(ledger.Publishing{RoutingKey: key, Body: []byte(`{}`)})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, _ := ex.Execute(ctx, ledger.Call{EffectID: fmt.Sprintf("e-%d-%d", g, i), Type: "t", Request: req})
				cancel()
				mu.Lock()
				got[res.Status]++
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("publishes stopped finishing: the outbox deadlocked")
	}
	require.Equal(t, map[ledger.Status]int{ledger.StatusSucceeded: 320, ledger.StatusFailedRetryable: 320}, got)
}

// A redirect is not followed: following it would turn the POST into a GET
// without a body and count the GET's 200 as the effect's success.
func TestHTTPRedirectIsNotASuccess(t *testing.T) {
	t.Parallel()
	var posts int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodPost {
			posts++
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	res, err := (&ledger.HTTPExecutor{}).Execute(context.Background(), ledger.Call{EffectID: "e", Target: srv.URL, IdempotencyKey: "k", Request: []byte(`{}`)})
	require.Error(t, err)
	require.Equal(t, ledger.StatusFailedTerminal, res.Status)
	require.Equal(t, 1, posts)
}

// An executor error quoting bytes that are not valid UTF-8 must not fail
// the batch of outcomes it is written with.
func TestOutcomeWithUnstorableErrorTextIsWritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	ex := funcExecutor{fn: func(_ context.Context, call ledger.Call) (ledger.Result, error) {
		if call.BusinessKey == "bad" {
			return ledger.Result{Status: ledger.StatusFailedTerminal}, fmt.Errorf("target said %s", "\xff\xfe\x00"+strings.Repeat("é", 600))
		}
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
	var ids []string
	for _, k := range []string{"a", "b", "bad", "c"} {
		ids = append(ids, f.record(t, ctx, ledger.Effect{Type: "pay", BusinessKey: k, Request: []byte(`{}`)})[0].ID)
	}
	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"pay": ex}})
	for i, id := range ids {
		want := ledger.StatusSucceeded
		if i == 2 {
			want = ledger.StatusFailedTerminal
		}
		f.waitFor(t, id, status(want))
	}
}
