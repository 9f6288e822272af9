package httpinbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// discard is a ResponseWriter whose output nobody receives: the process died
// after the handler's transaction committed and before the response left.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func TestCrashAfterCommitReplaysTheCommittedResult(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})

	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount": 9}`))
	req.Header.Set(httpinbox.HeaderKey, "k1")
	h.ServeHTTP(&discard{h: http.Header{}}, req)
	require.Equal(t, 1, f.count())

	retry := post(h, "k1", `{"amount": 9}`)
	require.Equal(t, http.StatusCreated, retry.Code)
	require.Equal(t, "true", retry.Header().Get(httpinbox.HeaderReplayed))
	require.Contains(t, retry.Body.String(), `"amount":9`)
	require.Equal(t, 1, f.count(), "the retry must not run the handler again")
	require.EqualValues(t, 1, f.runs.Load())
}

func TestCrashBeforeCommitRunsOnceAfterTheLeaseExpires(t *testing.T) {
	t.Parallel()
	// A lease long enough for the first retry to come within it on a busy
	// machine, short enough for the test.
	f := newFixture(t, httpinbox.Config{Lease: 2 * time.Second})
	var crash atomic.Bool
	crash.Store(true)
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		resp, err := f.pay(ctx, tx, r)
		if crash.Load() {
			panic(http.ErrAbortHandler) // dies mid-handler, after the business write
		}
		return resp, err
	})

	require.PanicsWithValue(t, http.ErrAbortHandler, func() { post(h, "k1", `{"amount": 9}`) })
	require.Equal(t, 0, f.count(), "nothing of the crashed transaction is visible")
	require.Equal(t, "started", f.state("k1"))
	crash.Store(false)

	rec := post(h, "k1", `{"amount": 9}`)
	requireProblem(t, rec, http.StatusConflict, httpinbox.CodeInProgress)
	require.NotEmpty(t, rec.Header().Get("Retry-After"))

	var took *httptest.ResponseRecorder
	require.Eventually(t, func() bool {
		took = post(h, "k1", `{"amount": 9}`)
		return took.Code != http.StatusConflict
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusCreated, took.Code, took.Body.String())
	require.Empty(t, took.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.count())

	replay := post(h, "k1", `{"amount": 9}`)
	require.Equal(t, "true", replay.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, took.Body.Bytes(), replay.Body.Bytes())
	require.Equal(t, 1, f.count())
	var attempts int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT attempts FROM `+f.tables.Table("http_keys")).Scan(&attempts))
	require.Equal(t, 2, attempts)
}

func TestSlowHandlerPastItsLeaseIsNotTakenOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{Lease: 50 * time.Millisecond})
	entered, release := make(chan struct{}), make(chan struct{})
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		close(entered)
		<-release
		return f.pay(ctx, tx, r)
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(h, "k1", `{"amount": 3}`) }()
	<-entered
	// Wait until the lease has expired in the database's clock.
	require.Eventually(t, func() bool {
		var expired bool
		err := f.pool.QueryRow(context.Background(),
			`SELECT locked_until <= now() FROM `+f.tables.Table("http_keys")).Scan(&expired)
		return err == nil && expired
	}, 20*time.Second, 10*time.Millisecond)

	requireProblem(t, post(h, "k1", `{"amount": 3}`), http.StatusConflict, httpinbox.CodeInProgress)
	close(release)
	require.Equal(t, http.StatusCreated, (<-done).Code)
	require.Equal(t, 1, f.count())
}

func TestCleanupDeletesOnlyExpiredKeysInChunks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	h := f.handler(httpinbox.Route{})
	for _, k := range []string{"a", "b", "c", "d", "e", "live1", "live2"} {
		require.Equal(t, http.StatusCreated, post(h, k, `{"amount": 1}`).Code)
	}
	f.elapse(forgotten, "idempotency_key NOT LIKE 'live%'")

	n, err := f.m.Cleanup(context.Background(), 2)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	rows, err := f.pool.Query(context.Background(), `SELECT idempotency_key FROM `+f.tables.Table("http_keys")+` ORDER BY 1`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"live1", "live2"}, left)

	n, err = f.m.Cleanup(context.Background(), 2)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestMetricsCountEachOutcome(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	f := newFixture(t, httpinbox.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	h := f.handler(httpinbox.Route{})

	post(h, "k1", `{"amount": 1}`) // started
	post(h, "k1", `{"amount": 1}`) // replayed
	post(h, "k1", `{"amount": 2}`) // conflict
	_, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.tables.Table("http_keys")+
		` (key_id, tenant, caller, operation, idempotency_key, fingerprint, lock_owner, locked_until, expires_at)
		SELECT decode($1, 'hex'), '', 'test-client', 'payments.create', 'busy', fingerprint, gen_random_uuid(),
		       now() + interval '1 hour', now() + interval '1 day'
		FROM `+f.tables.Table("http_keys")+` WHERE idempotency_key = 'k1'`,
		httpinbox.KeyID("", "test-client", "payments.create", "busy"))
	require.NoError(t, err)
	requireProblem(t, post(h, "busy", `{"amount": 1}`), http.StatusConflict, httpinbox.CodeInProgress)
	f.elapse(forgotten, "idempotency_key = 'k1'")
	n, err := f.m.Cleanup(context.Background(), 10)
	require.NoError(t, err)
	require.Equal(t, 1, n) // expired

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue // the request duration, checked on its own
			}
			for _, dp := range sum.DataPoints {
				got[m.Name] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{
		"idem.http_keys.started":     1,
		"idem.http_keys.replayed":    1,
		"idem.http_keys.conflict":    1,
		"idem.http_keys.in_progress": 1,
		"idem.http_keys.expired":     1,
	}, got)
}

func TestFailedCommitReleasesTheKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, httpinbox.Config{})
	// A deferred foreign key fails at COMMIT, after the response was stored
	// in the transaction.
	_, err := f.pool.Exec(context.Background(), `ALTER TABLE `+f.payments+
		` ADD COLUMN parent bigint REFERENCES `+f.payments+` (id) DEFERRABLE INITIALLY DEFERRED`)
	require.NoError(t, err)
	var broken atomic.Bool
	broken.Store(true)
	h := f.m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
		resp, err := f.pay(ctx, tx, r)
		if err == nil && broken.Load() {
			_, err = tx.Exec(ctx, `UPDATE `+f.payments+` SET parent = -1`)
		}
		return resp, err
	})

	requireProblem(t, post(h, "k1", `{"amount": 4}`), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.Equal(t, 0, f.count())
	require.Equal(t, "started", f.state("k1"), "the stored response rolled back with the commit")

	broken.Store(false)
	rec := post(h, "k1", `{"amount": 4}`)
	require.Equal(t, http.StatusCreated, rec.Code, "the released key runs again at once")
	require.Empty(t, rec.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, 1, f.count())
}
