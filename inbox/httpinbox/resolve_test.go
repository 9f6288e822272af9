package httpinbox_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// An operator's decision is final: a worker that turns up afterwards and
// finishes the operation, in the operator's state or another, or starts
// it, is refused with the operator's decision, and nothing changes.
func TestLateWorkerAfterAnOperatorResolvedIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	post(f.mux, "k1", `{}`)
	post(f.mux, "k2", `{}`)
	id, own := opID("", "test-client", "k1"), opID("", "test-client", "k2")
	ops := f.operations()
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, id) }))
	_, err := ops.Resolve(ctx, id, httpinbox.OperationResolution{As: httpinbox.OperationFailed,
		Reason: "worker host decommissioned", Operator: "alice"})
	require.NoError(t, err)
	before, err := ops.Get(ctx, id)
	require.NoError(t, err)

	for name, late := range map[string]func(context.Context, pgx.Tx) error{
		"finish as the operator did": func(ctx context.Context, tx pgx.Tx) error {
			return ops.Finish(ctx, tx, id, httpinbox.OperationFailed, map[string]string{"error": "card declined"})
		},
		"finish otherwise": func(ctx context.Context, tx pgx.Tx) error {
			return ops.Finish(ctx, tx, id, httpinbox.OperationSucceeded, map[string]string{"chargeId": "ch_1"})
		},
		"finish unknown": func(ctx context.Context, tx pgx.Tx) error {
			return ops.Finish(ctx, tx, id, httpinbox.OperationUnknown, nil)
		},
		"start": func(ctx context.Context, tx pgx.Tx) error { return ops.Start(ctx, tx, id) },
	} {
		err := f.move(late)
		require.ErrorIs(t, err, httpinbox.ErrOperationResolved, name)
		require.ErrorIs(t, err, httpinbox.ErrOperationState, name)
		var resolved *httpinbox.ResolvedError
		require.ErrorAs(t, err, &resolved, name)
		require.Equal(t, []string{id, "alice", "running", "failed", "worker host decommissioned"},
			[]string{resolved.ID, resolved.Operator, resolved.From, resolved.To, resolved.Reason}, name)
		require.WithinDuration(t, time.Now(), resolved.At, time.Minute, name)
		require.ErrorContains(t, err, "alice", name)
	}
	after, err := ops.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing changed")
	require.Equal(t, 1, f.auditRows())

	// An operation its own worker finished stays idempotent for it.
	for range 2 {
		require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
			return ops.Finish(ctx, tx, own, httpinbox.OperationSucceeded, nil)
		}))
	}
}

// waitingOn counts the backends of application name that wait for a lock.
func waitingOn(t *testing.T, pool *pgxpool.Pool, name string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND wait_event_type = 'Lock'`, name).Scan(&n))
	return n
}

// operatorPool is a pool whose backends carry their own application name,
// so that a test can see them wait.
func operatorPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	name := testdb.Name(t, "op")
	cfg := testdb.Pool(t).Config()
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, name
}

// race runs resolve as alice and as bob at once, released by one barrier,
// while hold keeps whoever goes first waiting at its audit row with the
// record locked, until both are in flight; it returns the outcome of each.
func race(t *testing.T, pool *pgxpool.Pool, name, audit string, resolve func(who string) error) map[string]error {
	t.Helper()
	ctx := context.Background()
	hold, err := testdb.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `LOCK TABLE `+audit+` IN SHARE MODE`)
	require.NoError(t, err)

	var (
		mu   sync.Mutex
		out  = map[string]error{}
		wg   sync.WaitGroup
		gate = make(chan struct{})
	)
	for _, who := range []string{"alice", "bob"} {
		wg.Go(func() {
			<-gate
			err := resolve(who)
			mu.Lock()
			defer mu.Unlock()
			out[who] = err
		})
	}
	close(gate)
	// Both wait: the first at the audit table, the second behind the first
	// (or, where operators do not take turns, one is already answered).
	require.Eventually(t, func() bool {
		mu.Lock()
		answered := len(out)
		mu.Unlock()
		return answered > 0 || waitingOn(t, pool, name) == 2
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, hold.Rollback(ctx))
	wg.Wait()
	return out
}

// winner returns who resolved and the loser's error, requiring exactly one
// of each.
func winner(t *testing.T, out map[string]error) (won, lost string) {
	t.Helper()
	require.Len(t, out, 2)
	switch {
	case out["alice"] == nil && out["bob"] != nil:
		return "alice", "bob"
	case out["bob"] == nil && out["alice"] != nil:
		return "bob", "alice"
	}
	t.Fatalf("want one resolution to stand and one refused, got %v", out)
	return "", ""
}

// Two operators resolve one operation at the same moment: the first
// decision stands, and the other is told that it was resolved already, by
// whom, when and how, not that a worker's transaction holds it.
func TestConcurrentResolvesOfAnOperationTellTheLoserWhoResolvedIt(t *testing.T) {
	t.Parallel()
	f := newOpFixture(t)
	ctx := context.Background()
	post(f.mux, "k1", `{}`)
	id := opID("", "test-client", "k1")
	require.NoError(t, f.move(func(ctx context.Context, tx pgx.Tx) error {
		return f.operations().Finish(ctx, tx, id, httpinbox.OperationUnknown, nil)
	}))
	pool, name := operatorPool(t)
	ops, err := httpinbox.NewOperations(pool, f.tables)
	require.NoError(t, err)
	decision := map[string]httpinbox.OperationState{"alice": httpinbox.OperationSucceeded, "bob": httpinbox.OperationFailed}

	out := race(t, pool, name, f.tables.Table("http_operations_audit"), func(who string) error {
		_, err := ops.Resolve(ctx, id, httpinbox.OperationResolution{As: decision[who], Reason: who + " read the provider's dashboard", Operator: who})
		return err
	})
	won, lost := winner(t, out)
	require.NotErrorIs(t, out[lost], httpinbox.ErrOperationInFlight, "no worker holds it")
	require.ErrorIs(t, out[lost], httpinbox.ErrOperationResolved)
	var resolved *httpinbox.ResolvedError
	require.ErrorAs(t, out[lost], &resolved)
	require.Equal(t, []string{id, won, "unknown", string(decision[won]), won + " read the provider's dashboard"},
		[]string{resolved.ID, resolved.Operator, resolved.From, resolved.To, resolved.Reason})
	require.WithinDuration(t, time.Now(), resolved.At, time.Minute)
	require.ErrorContains(t, out[lost], won)

	require.Equal(t, 1, f.auditRows(), "one decision")
	require.Equal(t, string(decision[won]), doc(t, f.get(f.mux, "/operations/"+id)).State)
	// Later, the same answer.
	_, err = ops.Resolve(ctx, id, httpinbox.OperationResolution{As: decision[lost], Reason: "again", Operator: lost})
	require.ErrorAs(t, err, &resolved)
	require.Equal(t, won, resolved.Operator)
}

// The same for a key: two operators settle one unknown outcome at once,
// one as completed and one handing it back; the first decision stands and
// the other learns whose it was.
func TestConcurrentResolvesOfAKeyTellTheLoserWhoResolvedIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	ctx := context.Background()
	var runs atomic.Int64
	require.Equal(t, http.StatusGatewayTimeout, post(unknownHandler(f, &runs), "k1", `{"amount": 5}`).Code)
	keyID := httpinbox.KeyID("", "test-client", "payments.create", "k1")
	pool, name := operatorPool(t)
	keys, err := httpinbox.NewKeys(pool, f.tables)
	require.NoError(t, err)
	decision := map[string]httpinbox.KeyState{"alice": httpinbox.KeyCompleted, "bob": httpinbox.KeyStarted}

	out := race(t, pool, name, f.tables.Table("http_keys_audit"), func(who string) error {
		_, err := keys.Resolve(ctx, keyID, httpinbox.KeyResolution{As: decision[who], Reason: who + " asked the provider", Operator: who})
		return err
	})
	won, lost := winner(t, out)
	require.NotErrorIs(t, out[lost], httpinbox.ErrKeyInFlight, "no request holds it")
	require.ErrorIs(t, out[lost], httpinbox.ErrKeyResolved)
	var resolved *httpinbox.ResolvedError
	require.ErrorAs(t, out[lost], &resolved)
	require.Equal(t, []string{keyID, won, "unknown", string(decision[won]), won + " asked the provider"},
		[]string{resolved.ID, resolved.Operator, resolved.From, resolved.To, resolved.Reason})
	require.WithinDuration(t, time.Now(), resolved.At, time.Minute)
	require.ErrorContains(t, out[lost], won)

	history, err := keys.History(ctx, keyID)
	require.NoError(t, err)
	require.Len(t, history, 1, "one decision")
	require.Equal(t, string(decision[won]), f.state("k1"))
}
