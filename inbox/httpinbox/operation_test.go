package httpinbox_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// opFixture is a POST /payments route that accepts an operation per
// request, and GET /operations/{id}.
type opFixture struct {
	*fixture
	mux     *http.ServeMux
	follows func(paymentID int64) string // the effect an operation follows
}

func newOpFixture(t *testing.T) *opFixture {
	t.Helper()
	f := &opFixture{fixture: newFixture(t, httpinbox.Config{})}
	f.mux = f.routes(f.m)
	return f
}

// routes mounts the fixture's routes on a mux served by m.
func (f *opFixture) routes(m *httpinbox.Middleware) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Handle(httpinbox.Route{Operation: "payments.create"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO `+f.payments+` (key_id, amount) VALUES ($1, 1) RETURNING id`,
				httpinbox.FromContext(ctx).KeyID()).Scan(&id); err != nil {
				return httpinbox.Response{}, err
			}
			a := httpinbox.Accepted{Fields: map[string]int64{"paymentId": id}}
			if f.follows != nil {
				a.Follows = f.follows(id)
			}
			return m.Accept(ctx, tx, a)
		}))
	mux.Handle("GET /operations/{id}", m.OperationStatus())
	return mux
}

// get reads path as the caller (the fixture's default caller when "").
func (f *opFixture) get(mux http.Handler, path string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return rec
}

type opDoc struct {
	OperationID string          `json:"operationId"`
	State       string          `json:"state"`
	PaymentID   int64           `json:"paymentId"`
	Result      json.RawMessage `json:"result"`
}

func doc(t *testing.T, rec *httptest.ResponseRecorder) opDoc {
	t.Helper()
	var d opDoc
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d), rec.Body.String())
	return d
}

func TestOperationStatusFlowSurvivesARestart(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	accepted := post(f.mux, "k1", `{}`)
	require.Equal(t, http.StatusAccepted, accepted.Code, accepted.Body.String())
	id := "op_" + httpinbox.KeyID("", "test-client", "payments.create", "k1")[:24]
	require.Equal(t, "/operations/"+id, accepted.Header().Get("Location"))
	require.Equal(t, "1", accepted.Header().Get("Retry-After"))
	require.Equal(t, id, accepted.Header().Get(httpinbox.HeaderResourceID))
	require.Regexp(t, `^\{"operationId":"`+id+`","state":"accepted","paymentId":\d+\}$`, accepted.Body.String())

	// Every process restarts: a new pool and a new middleware find it.
	pool, err := pgxpool.New(ctx, testdb.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m2, err := httpinbox.New(pool, httpinbox.Config{Tables: f.tables, Logger: slog.New(slog.DiscardHandler),
		Caller: func(r *http.Request) string { return "test-client" }})
	require.NoError(t, err)
	mux2 := f.routes(m2)
	status := f.get(mux2, "/operations/"+id)
	require.Equal(t, http.StatusOK, status.Code)
	require.Equal(t, "accepted", doc(t, status).State)
	require.Equal(t, doc(t, accepted).PaymentID, doc(t, status).PaymentID)
	require.Equal(t, "1", status.Header().Get("Retry-After"))

	// A worker, elsewhere, carries it out.
	ops, err := httpinbox.NewOperations(pool, f.tables)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ops.Start(ctx, tx, id) }))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ops.Start(ctx, tx, id) }), "again: no-op")
	require.Equal(t, "running", doc(t, f.get(mux2, "/operations/"+id)).State)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ops.Finish(ctx, tx, id, httpinbox.OperationSucceeded, map[string]string{"chargeId": "ch_1"})
	}))
	done := f.get(f.mux, "/operations/"+id)
	require.Equal(t, http.StatusOK, done.Code)
	require.Equal(t, "succeeded", doc(t, done).State)
	require.JSONEq(t, `{"chargeId":"ch_1"}`, string(doc(t, done).Result))
	require.Empty(t, done.Header().Get("Retry-After"), "finished: nothing to wait for")

	for name, move := range map[string]func(tx pgx.Tx) error{
		"finish the same":    func(tx pgx.Tx) error { return ops.Finish(ctx, tx, id, httpinbox.OperationSucceeded, nil) },
		"finish differently": func(tx pgx.Tx) error { return ops.Finish(ctx, tx, id, httpinbox.OperationFailed, nil) },
		"start":              func(tx pgx.Tx) error { return ops.Start(ctx, tx, id) },
		"unknown id":         func(tx pgx.Tx) error { return ops.Start(ctx, tx, "op_nope") },
	} {
		err := pgx.BeginFunc(ctx, pool, move)
		switch name {
		case "finish the same":
			require.NoError(t, err, name)
		case "unknown id":
			require.ErrorIs(t, err, httpinbox.ErrOperationNotFound, name)
		default:
			require.ErrorIs(t, err, httpinbox.ErrOperationState, name)
		}
	}

	// Only its tenant and caller see it.
	requireProblem(t, f.get(f.mux, "/operations/"+id, "X-Test-Caller", "mallory"), http.StatusNotFound, httpinbox.CodeOperationNotFound)
	requireProblem(t, f.get(f.mux, "/operations/op_nope"), http.StatusNotFound, httpinbox.CodeOperationNotFound)

	// The request's retry replays its first answer; the status moved on.
	replay := post(f.mux, "k1", `{}`)
	require.Equal(t, "true", replay.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, accepted.Body.Bytes(), replay.Body.Bytes())
	require.Equal(t, "1", replay.Header().Get("Retry-After"))
	require.Equal(t, "/operations/"+id, replay.Header().Get("Location"))
	require.Equal(t, 1, f.count())

	// A finished operation is kept as long as its key, then cleaned up.
	got, err := ops.Get(ctx, id)
	require.NoError(t, err)
	require.False(t, got.FinishedAt.IsZero())
	require.True(t, got.ExpiresAt.After(got.FinishedAt.Add(23*time.Hour)))
	_, err = f.pool.Exec(ctx, `UPDATE `+f.tables.Table("http_operations")+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = f.m.Cleanup(ctx, 0)
	require.NoError(t, err)
	requireProblem(t, f.get(f.mux, "/operations/"+id), http.StatusNotFound, httpinbox.CodeOperationNotFound)
}

func TestAnonymousStatusRequestIsRefused(t *testing.T) {
	t.Parallel()
	f := &opFixture{fixture: newFixture(t, httpinbox.Config{Caller: func(r *http.Request) string { return r.Header.Get("X-Test-Caller") }})}
	f.mux = f.routes(f.m)
	requireProblem(t, f.get(f.mux, "/operations/op_1"), http.StatusUnauthorized, httpinbox.CodeScopeRequired)
}

// okExecutor answers every call with a charge.
type okExecutor struct{}

func (okExecutor) Execute(context.Context, ledger.Call) (ledger.Result, error) {
	return ledger.Result{Status: ledger.StatusSucceeded, Response: []byte(`{"chargeId":"ch_9"}`)}, nil
}
func (okExecutor) DeduplicatesByKey() bool { return true }

func TestOperationFollowsTheOutcomeOfItsLedgerEffect(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	effect := func(paymentID int64) string { return ledger.EffectID("charge", strconv.FormatInt(paymentID, 10)) }
	f.follows = effect
	op1 := doc(t, post(f.mux, "k1", `{}`))
	op2 := doc(t, post(f.mux, "k2", `{}`))
	require.Equal(t, "accepted", doc(t, f.get(f.mux, "/operations/"+op1.OperationID)).State, "its effect is not recorded yet")

	// The worker records the effects later, in its own transaction.
	l, err := ledger.New(ledger.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for _, op := range []opDoc{op1, op2} {
			if _, err := l.Record(ctx, tx, ledger.Effect{Type: "charge", BusinessKey: strconv.FormatInt(op.PaymentID, 10), Request: map[string]int{"amount": 1}}); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Equal(t, "running", doc(t, f.get(f.mux, "/operations/"+op1.OperationID)).State)

	// op2's charge is refused for good by an operator; op1's goes through.
	_, err = l.Resolve(ctx, effect(op2.PaymentID), ledger.Resolution{As: ledger.StatusFailedTerminal, Reason: "card blocked", Operator: "alice"})
	require.NoError(t, err)
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: f.pool, Tables: f.tables, Logger: slog.New(slog.DiscardHandler),
		Executors: map[string]ledger.Executor{"charge": okExecutor{}}, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(runCtx) }()
	require.Eventually(t, func() bool {
		return doc(t, f.get(f.mux, "/operations/"+op1.OperationID)).State == "succeeded"
	}, 20*time.Second, 20*time.Millisecond)
	stop()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the dispatcher did not stop")
	}
	require.JSONEq(t, `{"chargeId":"ch_9"}`, string(doc(t, f.get(f.mux, "/operations/"+op1.OperationID)).Result))
	failed := doc(t, f.get(f.mux, "/operations/"+op2.OperationID))
	require.Equal(t, "failed", failed.State)
	require.Contains(t, string(failed.Result), "OPERATION_FAILED")

	// The outcome is stored: it outlives the ledger's own retention.
	_, err = f.pool.Exec(ctx, `DELETE FROM `+f.tables.Table("ledger_audit"))
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `DELETE FROM `+f.tables.Table("ledger"))
	require.NoError(t, err)
	require.Equal(t, "succeeded", doc(t, f.get(f.mux, "/operations/"+op1.OperationID)).State)
	require.Equal(t, "failed", doc(t, f.get(f.mux, "/operations/"+op2.OperationID)).State)
}

func TestAcceptingAnotherScopesOperationIDIsAConflict(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	var last error
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		resp, err := f.m.Accept(ctx, tx, httpinbox.Accepted{ID: "op_fixed"})
		last = err
		return resp, err
	})
	require.Equal(t, http.StatusAccepted, post(h, "k1", `{}`, "X-Test-Caller", "alice").Code)
	requireProblem(t, post(h, "k1", `{}`, "X-Test-Caller", "bob"), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.ErrorIs(t, last, httpinbox.ErrOperationConflict)
}

// Running is optional: work that finishes at once goes from accepted
// straight to its outcome, and nothing goes back to running afterwards.
func TestOperationFinishesStraightFromAccepted(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	ops, err := httpinbox.NewOperations(f.pool, f.tables)
	require.NoError(t, err)
	outcomes := map[string]httpinbox.OperationState{
		"k1": httpinbox.OperationSucceeded, "k2": httpinbox.OperationFailed, "k3": httpinbox.OperationUnknown,
	}
	ids := map[string]string{}
	for k, state := range outcomes {
		ids[k] = doc(t, post(f.mux, k, `{}`)).OperationID
		require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			return ops.Finish(ctx, tx, ids[k], state, map[string]string{"k": k})
		}), "%s: accepted → %s", k, state)
		status := f.get(f.mux, "/operations/"+ids[k])
		require.Equal(t, string(state), doc(t, status).State)
		require.JSONEq(t, `{"k":"`+k+`"}`, string(doc(t, status).Result))
		require.Empty(t, status.Header().Get("Retry-After"))
		require.ErrorIs(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error { return ops.Start(ctx, tx, ids[k]) }),
			httpinbox.ErrOperationState, "%s: never back to running", k)
	}

	// Unknown again takes the new result and keeps the time it became
	// unknown; a reconciler then finishes it.
	before, err := ops.Get(ctx, ids["k3"])
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		return ops.Finish(ctx, tx, ids["k3"], httpinbox.OperationUnknown, map[string]string{"checked": "again"})
	}))
	after, err := ops.Get(ctx, ids["k3"])
	require.NoError(t, err)
	require.JSONEq(t, `{"checked":"again"}`, string(after.Result))
	require.True(t, after.UpdatedAt.Equal(before.UpdatedAt), "%v, then %v", before.UpdatedAt, after.UpdatedAt)
	require.True(t, after.FinishedAt.IsZero())
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		return ops.Finish(ctx, tx, ids["k3"], httpinbox.OperationSucceeded, nil)
	}))
	got, err := ops.Get(ctx, ids["k3"])
	require.NoError(t, err)
	require.Equal(t, httpinbox.OperationSucceeded, got.State)
	require.False(t, got.FinishedAt.IsZero())
}

// An operation id comes from the URL, unescaped: bytes that are not UTF-8,
// a NUL, control characters or a length no id can have name no operation,
// and are answered 404 like any unknown id, never a 500 from the database
// refusing the text.
func TestOperationStatusOfAMalformedIDIsNotFound(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	for _, path := range []string{
		"/operations/%00%ff", "/operations/%ff%fe", "/operations/op%00", "/operations/a%0Ab", "/operations/%1b%5B2J",
		"/operations/%7F", "/operations/%C2%85", "/operations/" + strings.Repeat("a", 256),
	} {
		requireProblem(t, f.get(f.mux, path), http.StatusNotFound, httpinbox.CodeOperationNotFound)
	}
	ops := f.operations()
	for _, id := range []string{"\x00\xff", "op\x00", "\xff", ""} {
		_, err := ops.Get(ctx, id)
		require.ErrorIs(t, err, httpinbox.ErrOperationNotFound, "%q", id)
		require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, id) }),
			httpinbox.ErrOperationNotFound, "%q", id)
		require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
			return ops.Finish(ctx, tx, id, httpinbox.OperationFailed, nil)
		}), httpinbox.ErrOperationNotFound, "%q", id)
		_, err = ops.Resolve(ctx, id, httpinbox.OperationResolution{As: httpinbox.OperationFailed, Reason: "x", Operator: "alice"})
		require.ErrorIs(t, err, httpinbox.ErrOperationNotFound, "%q", id)
		history, err := ops.History(ctx, id)
		require.NoError(t, err, "%q", id)
		require.Empty(t, history)
	}

	// No handler can accept an operation under such an id either.
	h := f.m.Handle(httpinbox.Route{Operation: "reports.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		return f.m.Accept(ctx, tx, httpinbox.Accepted{ID: "rep\x00"})
	})
	requireProblem(t, post(h, "k-bad", `{}`), http.StatusInternalServerError, httpinbox.CodeInternal)
}

// An id with characters a URL escapes is found at its default Location.
func TestOperationWithAnIDToEscapeIsFoundAtItsLocation(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	const id = "rep 2025?q1#x%é"
	h := f.m.Handle(httpinbox.Route{Operation: "reports.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		return f.m.Accept(ctx, tx, httpinbox.Accepted{ID: id})
	})
	accepted := post(h, "k1", `{}`)
	require.Equal(t, http.StatusAccepted, accepted.Code, accepted.Body.String())
	location := accepted.Header().Get("Location")
	require.Equal(t, "/operations/rep%202025%3Fq1%23x%25%C3%A9", location)
	status := f.get(f.mux, location)
	require.Equal(t, http.StatusOK, status.Code, status.Body.String())
	require.Equal(t, id, doc(t, status).OperationID)
}
