package httpinbox_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

// opID is the default id of the operation the fixture's route accepts for
// key, sent by tenant and caller.
func opID(tenant, caller, key string) string {
	return "op_" + httpinbox.KeyID(tenant, caller, "payments.create", key)[:24]
}

func (f *fixture) operations() *httpinbox.Operations {
	ops, err := httpinbox.NewOperations(f.pool, f.tables)
	require.NoError(f.t, err)
	return ops
}

// move runs fn in a transaction of its own, as a worker does.
func (f *fixture) move(fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx := context.Background()
	return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

// auditRows counts the rows of http_operations_audit.
func (f *fixture) auditRows() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.tables.Table("http_operations_audit")).Scan(&n))
	return n
}

func TestUnknownOperationIsResolvedByAnOperatorWithAnAuditRow(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	require.Equal(t, http.StatusAccepted, post(f.mux, "k1", `{}`).Code)
	id := opID("", "test-client", "k1")
	ops := f.operations()
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		if err := ops.Start(ctx, tx, id); err != nil {
			return err
		}
		return ops.Finish(ctx, tx, id, httpinbox.OperationUnknown, map[string]string{"error": "provider timeout"})
	}))

	unknown, err := ops.List(ctx, httpinbox.OperationFilter{State: httpinbox.OperationUnknown})
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	require.Equal(t, id, unknown[0].ID)
	require.Equal(t, "payments.create", unknown[0].Kind)
	require.Equal(t, "test-client", unknown[0].Caller)
	require.JSONEq(t, `{"error":"provider timeout"}`, string(unknown[0].Result))
	status := f.get(f.mux, "/operations/"+id)
	require.Equal(t, "unknown", doc(t, status).State)
	require.Empty(t, status.Header().Get("Retry-After"))

	for _, bad := range []httpinbox.OperationResolution{
		{As: httpinbox.OperationSucceeded, Operator: "alice"},                  // no reason
		{As: httpinbox.OperationSucceeded, Reason: "seen"},                     // no operator
		{As: httpinbox.OperationRunning, Reason: "seen", Operator: "alice"},    // not final
		{As: httpinbox.OperationUnknown, Reason: "seen", Operator: "alice"},    // not final
		{As: httpinbox.OperationState("done"), Reason: "x", Operator: "alice"}, // no such state
	} {
		_, err := ops.Resolve(ctx, id, bad)
		require.Error(t, err, "%+v", bad)
	}
	require.Zero(t, f.auditRows())

	done, err := ops.Resolve(ctx, id, httpinbox.OperationResolution{As: httpinbox.OperationSucceeded,
		Result: map[string]string{"chargeId": "ch_1"}, Reason: "the provider's dashboard shows the charge", Operator: "alice"})
	require.NoError(t, err)
	require.Equal(t, httpinbox.OperationSucceeded, done.State)
	require.False(t, done.FinishedAt.IsZero())
	status = f.get(f.mux, "/operations/"+id)
	require.Equal(t, "succeeded", doc(t, status).State)
	require.JSONEq(t, `{"chargeId":"ch_1"}`, string(doc(t, status).Result))

	history, err := ops.History(ctx, id)
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, []string{"alice", "unknown", "succeeded", "the provider's dashboard shows the charge"},
		[]string{history[0].Operator, string(history[0].From), string(history[0].To), history[0].Reason})
	require.WithinDuration(t, time.Now(), history[0].At, time.Minute)

	// The decision is final: neither the operator nor a late worker moves it.
	_, err = ops.Resolve(ctx, id, httpinbox.OperationResolution{As: httpinbox.OperationFailed, Reason: "x", Operator: "bob"})
	require.ErrorIs(t, err, httpinbox.ErrOperationState)
	require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		return ops.Finish(ctx, tx, id, httpinbox.OperationFailed, nil)
	}), httpinbox.ErrOperationState)
	require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, id) }),
		httpinbox.ErrOperationState)
	_, err = ops.Resolve(ctx, "op_nope", httpinbox.OperationResolution{As: httpinbox.OperationFailed, Reason: "x", Operator: "bob"})
	require.ErrorIs(t, err, httpinbox.ErrOperationNotFound)
	require.Equal(t, 1, f.auditRows())

	// Once it expires, retention takes its audit rows with it.
	_, err = f.pool.Exec(ctx, `UPDATE `+f.tables.Table("http_operations")+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	n, err := httpinbox.CleanupExpired(ctx, f.pool, f.tables, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, f.auditRows())
	_, err = ops.Get(ctx, id)
	require.ErrorIs(t, err, httpinbox.ErrOperationNotFound)
}

// A worker that crashed for good leaves its operation accepted or running:
// the operator fails it, and a worker that shows up later cannot undo that.
func TestOperationWhoseWorkerIsGoneIsResolvedAsFailed(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	post(f.mux, "k1", `{}`)
	post(f.mux, "k2", `{}`)
	accepted, running := opID("", "test-client", "k1"), opID("", "test-client", "k2")
	ops := f.operations()
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, running) }))

	for from, id := range map[httpinbox.OperationState]string{httpinbox.OperationAccepted: accepted, httpinbox.OperationRunning: running} {
		op, err := ops.Resolve(ctx, id, httpinbox.OperationResolution{As: httpinbox.OperationFailed,
			Reason: "worker host decommissioned", Operator: "alice"})
		require.NoError(t, err, from)
		require.Equal(t, httpinbox.OperationFailed, op.State)
		status := doc(t, f.get(f.mux, "/operations/"+id))
		require.Equal(t, "failed", status.State)
		require.Contains(t, string(status.Result), "OPERATION_FAILED", "the default result of a failure")
		history, err := ops.History(ctx, id)
		require.NoError(t, err)
		require.Len(t, history, 1)
		require.Equal(t, from, history[0].From)
	}
	require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, accepted) }),
		httpinbox.ErrOperationState, "a late worker learns not to carry it out")
	require.ErrorIs(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		return ops.Finish(ctx, tx, running, httpinbox.OperationSucceeded, nil)
	}), httpinbox.ErrOperationState)
}

func TestOperationHeldByAWorkersTransactionCannotBeResolved(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	post(f.mux, "k1", `{}`)
	id := opID("", "test-client", "k1")
	ops := f.operations()
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, ops.Start(ctx, tx, id))
	r := httpinbox.OperationResolution{As: httpinbox.OperationFailed, Reason: "stuck?", Operator: "alice"}
	_, err = ops.Resolve(ctx, id, r)
	require.ErrorIs(t, err, httpinbox.ErrOperationInFlight)
	require.NoError(t, ops.Finish(ctx, tx, id, httpinbox.OperationSucceeded, nil))
	require.NoError(t, tx.Commit(ctx))
	_, err = ops.Resolve(ctx, id, r)
	require.ErrorIs(t, err, httpinbox.ErrOperationState, "the worker finished it meanwhile")
	require.Zero(t, f.auditRows())
}

func TestOperationFollowingAnEffectIsResolvedThroughTheLedger(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	effect := func(paymentID int64) string { return ledger.EffectID("charge", strconv.FormatInt(paymentID, 10)) }
	f.follows = effect
	op := doc(t, post(f.mux, "k1", `{}`))
	ops := f.operations()
	_, err := ops.Resolve(ctx, op.OperationID, httpinbox.OperationResolution{As: httpinbox.OperationFailed,
		Reason: "x", Operator: "alice"})
	require.ErrorIs(t, err, httpinbox.ErrOperationFollowsEffect)
	require.ErrorContains(t, err, "idem ledger resolve "+effect(op.PaymentID))
	require.Zero(t, f.auditRows())

	// Resolved through the ledger, the operation follows, and List sees it
	// where it now stands.
	l, err := ledger.New(ledger.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(t, err)
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		_, err := l.Record(ctx, tx, ledger.Effect{Type: "charge", BusinessKey: strconv.FormatInt(op.PaymentID, 10), Request: map[string]int{"amount": 1}})
		return err
	}))
	_, err = l.Resolve(ctx, effect(op.PaymentID), ledger.Resolution{As: ledger.StatusFailedTerminal, Reason: "card blocked", Operator: "alice"})
	require.NoError(t, err)
	stale, err := ops.List(ctx, httpinbox.OperationFilter{State: httpinbox.OperationAccepted})
	require.NoError(t, err)
	require.Empty(t, stale, "stored as accepted, but its effect failed for good")
	failed, err := ops.List(ctx, httpinbox.OperationFilter{State: httpinbox.OperationFailed})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, op.OperationID, failed[0].ID)
	require.Equal(t, effect(op.PaymentID), failed[0].Follows)
}

func TestOperationListFiltersByStateTenantCallerAndKind(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	reports := f.m.Handle(httpinbox.Route{Operation: "reports.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		return f.m.Accept(ctx, tx, httpinbox.Accepted{})
	})
	post(f.mux, "k1", `{}`, "X-Tenant-ID", "acme", "X-Test-Caller", "alice")
	post(f.mux, "k2", `{}`, "X-Tenant-ID", "acme", "X-Test-Caller", "bob")
	post(f.mux, "k3", `{}`, "X-Tenant-ID", "globex", "X-Test-Caller", "alice")
	require.Equal(t, http.StatusAccepted, post(reports, "k4", `{}`, "X-Tenant-ID", "globex", "X-Test-Caller", "carol").Code)
	ops := f.operations()
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, opID("acme", "bob", "k2")) }))

	ids := func(filter httpinbox.OperationFilter) []string {
		t.Helper()
		list, err := ops.List(ctx, filter)
		require.NoError(t, err)
		out := []string{}
		for _, op := range list {
			out = append(out, op.ID)
		}
		return out
	}
	k1, k2, k3 := opID("acme", "alice", "k1"), opID("acme", "bob", "k2"), opID("globex", "alice", "k3")
	require.Len(t, ids(httpinbox.OperationFilter{}), 4)
	require.Equal(t, []string{k1}, ids(httpinbox.OperationFilter{Limit: 1}), "oldest first")
	require.Equal(t, []string{k1, k2}, ids(httpinbox.OperationFilter{Tenant: "acme"}))
	require.Equal(t, []string{k1, k3}, ids(httpinbox.OperationFilter{Caller: "alice"}))
	require.Equal(t, []string{k2}, ids(httpinbox.OperationFilter{State: httpinbox.OperationRunning}))
	require.Equal(t, []string{k3}, ids(httpinbox.OperationFilter{Tenant: "globex", Kind: "payments.create"}))
	reportOps, err := ops.List(ctx, httpinbox.OperationFilter{Kind: "reports.create"})
	require.NoError(t, err)
	require.Len(t, reportOps, 1)
	require.Equal(t, "carol", reportOps[0].Caller)
	_, err = ops.List(ctx, httpinbox.OperationFilter{State: "done"})
	require.Error(t, err)
}

// gaugeValues collects reader's float64 gauges by name.
func gaugeValues(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok {
				for _, dp := range g.DataPoints {
					out[m.Name] = dp.Value
				}
			}
		}
	}
	return out
}

func TestOperationGaugesReportTheOldestInProgressAndTheOldestUnknown(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	f := &opFixture{fixture: newFixture(t, httpinbox.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})}
	f.mux = f.routes(f.m)
	ctx := context.Background()
	const inProgress, unknown = "idem.http_operations.oldest_in_progress_age", "idem.http_operations.oldest_unknown_age"
	g := gaugeValues(t, reader)
	require.Contains(t, g, inProgress)
	require.Contains(t, g, unknown)
	require.Zero(t, g[inProgress], "nothing waits")
	require.Zero(t, g[unknown], "nothing waits")

	for _, k := range []string{"k1", "k2", "k3", "k4"} {
		require.Equal(t, http.StatusAccepted, post(f.mux, k, `{}`).Code)
	}
	f.follows = func(paymentID int64) string { return ledger.EffectID("charge", strconv.FormatInt(paymentID, 10)) }
	require.Equal(t, http.StatusAccepted, post(f.mux, "k5", `{}`).Code)
	ops := f.operations()
	id := func(k string) string { return opID("", "test-client", k) }
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		if err := ops.Start(ctx, tx, id("k2")); err != nil {
			return err
		}
		if err := ops.Finish(ctx, tx, id("k3"), httpinbox.OperationUnknown, nil); err != nil {
			return err
		}
		return ops.Finish(ctx, tx, id("k4"), httpinbox.OperationSucceeded, nil)
	}))
	back := func(column, key, age string) {
		t.Helper()
		_, err := f.pool.Exec(ctx, `UPDATE `+f.tables.Table("http_operations")+` SET `+column+` = now() - $2::interval
			WHERE operation_id = $1`, id(key), age)
		require.NoError(t, err)
	}
	back("created_at", "k1", "1 hour")  // accepted
	back("created_at", "k2", "3 hours") // running
	back("updated_at", "k3", "2 hours") // unknown for two hours
	back("created_at", "k4", "9 hours") // succeeded: nothing waits
	back("created_at", "k5", "5 days")  // follows an effect: the ledger measures it
	// Finished unknown again (a reconciler that still cannot tell): it has
	// waited just as long.
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		return ops.Finish(ctx, tx, id("k3"), httpinbox.OperationUnknown, map[string]string{"checked": "again"})
	}))

	g = gaugeValues(t, reader)
	require.InDelta(t, 3*3600, g[inProgress], 60)
	require.InDelta(t, 2*3600, g[unknown], 60)
	s, err := ops.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[httpinbox.OperationState]int64{httpinbox.OperationAccepted: 2, httpinbox.OperationRunning: 1,
		httpinbox.OperationUnknown: 1, httpinbox.OperationSucceeded: 1}, s.Counts)
	require.InDelta(t, 3*time.Hour, s.OldestInProgress, float64(time.Minute))
	require.InDelta(t, 2*time.Hour, s.OldestUnknown, float64(time.Minute))

	for _, k := range []string{"k2", "k3"} {
		_, err := ops.Resolve(ctx, id(k), httpinbox.OperationResolution{As: httpinbox.OperationFailed, Reason: "INC-7", Operator: "alice"})
		require.NoError(t, err)
	}
	g = gaugeValues(t, reader)
	require.InDelta(t, 3600, g[inProgress], 60, "k1 is the oldest left")
	require.Zero(t, g[unknown])
}
