package httpinbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// bulkFixture serves a bulk payments endpoint: each item inserts a payment
// whose key_id is the item's KeyID. An amount of 0 is invalid, 13 fails
// while failing is set, and crashAt makes the nth item run panic.
type bulkFixture struct {
	*fixture
	h       http.Handler
	failing atomic.Bool
	crashAt atomic.Int64 // 1-based item run that panics; 0: none
	ran     sync.Map     // item key → *atomic.Int64 runs
}

func newBulkFixture(t *testing.T, cfg httpinbox.Config, b httpinbox.Bulk) *bulkFixture {
	t.Helper()
	f := &bulkFixture{fixture: newFixture(t, cfg)}
	f.failing.Store(true)
	if b.Operation == "" {
		b.Operation = "payments.bulk"
	}
	f.h = f.m.Bulk(b, f.item)
	return f
}

type bulkItem struct {
	ItemKey string `json:"itemKey"`
	Amount  int64  `json:"amount"`
}

func (f *bulkFixture) item(ctx context.Context, tx pgx.Tx, raw json.RawMessage) (any, error) {
	n := f.runs.Add(1)
	if n == f.crashAt.Load() {
		panic(http.ErrAbortHandler) // the process dies mid-bulk
	}
	var it bulkItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return nil, httpinbox.Invalid(err)
	}
	c, _ := f.ran.LoadOrStore(it.ItemKey, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	switch {
	case it.Amount <= 0:
		return nil, httpinbox.Invalid(errors.New("amount must be positive"))
	case it.Amount == 13 && f.failing.Load():
		return nil, errors.New("the ledger is unlucky today")
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+f.payments+` (key_id, amount) VALUES ($1, $2) RETURNING id`,
		httpinbox.FromContext(ctx).KeyID(), it.Amount).Scan(&id); err != nil {
		return nil, err
	}
	return map[string]any{"paymentId": id, "amount": it.Amount}, nil
}

// runsOf returns how often the handler ran for an item key.
func (f *bulkFixture) runsOf(key string) int64 {
	c, ok := f.ran.Load(key)
	if !ok {
		return 0
	}
	return c.(*atomic.Int64).Load()
}

// items is a bulk body of key=amount pairs.
func items(pairs ...string) string {
	var parts []string
	for _, p := range pairs {
		k, a, _ := strings.Cut(p, "=")
		parts = append(parts, fmt.Sprintf(`{"itemKey":%q,"amount":%s}`, k, a))
	}
	return `{"items":[` + strings.Join(parts, ",") + `]}`
}

type itemResult struct {
	ItemKey   string          `json:"itemKey"`
	Status    string          `json:"status"`
	PaymentID int64           `json:"paymentId"`
	Problem   json.RawMessage `json:"problem"`
}

// results decodes a bulk answer.
func results(t *testing.T, rec *httptest.ResponseRecorder) []itemResult {
	t.Helper()
	var out struct{ Items []itemResult }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
	return out.Items
}

func statuses(rs []itemResult) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.ItemKey+":"+r.Status)
	}
	return strings.Join(s, " ")
}

func TestBulkReplayOfTheOperationKeyReturnsTheSameBytes(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	first := post(f.h, "op-1", items("a=10", "b=20", "c=30"))
	require.Equal(t, http.StatusOK, first.Code, first.Body.String())
	rs := results(t, first)
	require.Equal(t, "a:accepted b:accepted c:accepted", statuses(rs))
	require.Regexp(t, `^\{"items":\[\{"itemKey":"a","status":"accepted","amount":10,"paymentId":\d+\},`, first.Body.String())

	// The same operation again, spelled differently: the same bytes.
	again := post(f.h, "op-1", `{ "items": [ {"amount":10,"itemKey":"a"}, {"itemKey":"b","amount":20.0}, {"itemKey":"c","amount":3e1} ] }`)
	require.Equal(t, http.StatusOK, again.Code)
	require.Equal(t, "true", again.Header().Get(httpinbox.HeaderReplayed))
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	require.Equal(t, 3, f.count())
	require.EqualValues(t, 3, f.runs.Load())
	require.Equal(t, 4, f.records(), "the operation's record and one per item")
}

func TestBulkWithAChangedBodyIsRefusedAndRunsNothing(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	require.Equal(t, http.StatusOK, post(f.h, "op-1", items("a=10", "b=20")).Code)
	for _, changed := range []string{items("a=10", "b=21"), items("b=20", "a=10"), items("a=10"), items("a=10", "b=20", "c=30")} {
		requireProblem(t, post(f.h, "op-1", changed), http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)
	}
	require.EqualValues(t, 2, f.runs.Load())
	require.Equal(t, 2, f.count())
}

func TestOverlappingOperationAnswersAlreadyAcceptedWithTheOriginalResult(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	first := results(t, post(f.h, "op-1", items("a=10", "b=20")))
	second := post(f.h, "op-2", items("b=20", "c=30"))
	require.Equal(t, http.StatusOK, second.Code, second.Body.String())
	rs := results(t, second)
	require.Equal(t, "b:already_accepted c:accepted", statuses(rs))
	require.Equal(t, first[1].PaymentID, rs[0].PaymentID, "b's original result")
	require.Contains(t, second.Body.String(), fmt.Sprintf(`{"itemKey":"b","status":"already_accepted","amount":20,"paymentId":%d}`, first[1].PaymentID))
	for _, k := range []string{"a", "b", "c"} {
		require.EqualValues(t, 1, f.runsOf(k), k)
	}
	require.Equal(t, 3, f.count())

	// The same item key for another item is refused, the others go on.
	third := post(f.h, "op-3", items("b=25", "d=40"))
	require.Equal(t, http.StatusMultiStatus, third.Code)
	rs = results(t, third)
	require.Equal(t, "b:rejected d:accepted", statuses(rs))
	require.Contains(t, string(rs[0].Problem), httpinbox.CodeKeyReused)
	require.EqualValues(t, 1, f.runsOf("b"))
	require.Equal(t, 4, f.count())
}

func TestBulkRetryOfFailedItemsRunsOnlyThose(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	first := post(f.h, "op-1", items("a=10", "b=0", "c=13"))
	require.Equal(t, http.StatusMultiStatus, first.Code, first.Body.String())
	rs := results(t, first)
	require.Equal(t, "a:accepted b:rejected c:failed", statuses(rs))
	require.Contains(t, string(rs[1].Problem), "amount must be positive")
	require.Contains(t, string(rs[2].Problem), httpinbox.CodeInternal)
	require.NotContains(t, first.Body.String(), "unlucky", "a server error's text stays in the logs")
	require.Equal(t, 1, f.count(), "nothing of the refused items is kept")
	require.Equal(t, 2, f.records(), "the operation and a")

	f.failing.Store(false)
	retry := post(f.h, "op-2", items("a=10", "b=5", "c=13"))
	require.Equal(t, http.StatusOK, retry.Code, retry.Body.String())
	require.Equal(t, "a:already_accepted b:accepted c:accepted", statuses(results(t, retry)))
	require.EqualValues(t, 1, f.runsOf("a"), "a succeeded item is never run again")
	require.Equal(t, 3, f.count())

	// op-1 still answers what it answered.
	require.Equal(t, first.Body.Bytes(), post(f.h, "op-1", items("a=10", "b=0", "c=13")).Body.Bytes())
}

func TestCrashMidBulkLosesNoItemAndRunsNoneTwice(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{Lease: 200 * time.Millisecond}, httpinbox.Bulk{})
	body := items("a=1", "b=2", "c=3", "d=4", "e=5")
	f.crashAt.Store(3)
	require.PanicsWithValue(t, http.ErrAbortHandler, func() { post(f.h, "op-1", body) })
	require.Zero(t, f.count(), "nothing of the crashed transaction exists")
	require.Equal(t, "started", f.state("op-1"))
	require.Equal(t, 1, f.records(), "no item record survives the crash")

	// Another operation carrying some of the items is not blocked by the
	// dead one, and runs them.
	other := post(f.h, "op-2", items("d=4", "e=5"))
	require.Equal(t, "d:accepted e:accepted", statuses(results(t, other)))

	var retry *httptest.ResponseRecorder
	require.Eventually(t, func() bool { // the crashed operation's lease ends
		retry = post(f.h, "op-1", body)
		return retry.Code != http.StatusConflict
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, retry.Code, retry.Body.String())
	require.Equal(t, "a:accepted b:accepted c:accepted d:already_accepted e:already_accepted", statuses(results(t, retry)))
	require.Equal(t, 5, f.count())
	var distinct int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(DISTINCT key_id) FROM `+f.payments).Scan(&distinct))
	require.Equal(t, 5, distinct, "one payment per item")
}

// The database connection dies under the bulk's transaction at its third
// item: nothing of the operation is kept, the client is told to retry, and
// the retry runs every item once.
func TestConnectionLostMidBulkLosesNoItemAndRunsNoneTwice(t *testing.T) {
	t.Parallel()
	f := &bulkFixture{fixture: newFixture(t, httpinbox.Config{})}
	var kill atomic.Bool
	kill.Store(true)
	f.h = f.m.Bulk(httpinbox.Bulk{Operation: "payments.bulk"}, func(ctx context.Context, tx pgx.Tx, raw json.RawMessage) (any, error) {
		if f.runs.Load() == 2 && kill.CompareAndSwap(true, false) {
			_, _ = tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		}
		return f.item(ctx, tx, raw)
	})
	body := items("a=1", "b=2", "c=3", "d=4")
	requireProblem(t, post(f.h, "op-1", body), http.StatusInternalServerError, httpinbox.CodeInternal)
	require.Zero(t, f.count())
	require.Equal(t, 1, f.records(), "only the operation's record, released")

	retry := post(f.h, "op-1", body)
	require.Equal(t, http.StatusOK, retry.Code, retry.Body.String())
	require.Equal(t, "a:accepted b:accepted c:accepted d:accepted", statuses(results(t, retry)))
	require.Equal(t, 4, f.count())
	require.Equal(t, 5, f.records())
}

func TestConcurrentOperationsSharingItemsRunEachItemOnce(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{})
	keys := []string{"a=1", "b=2", "c=3", "d=4", "e=5", "f=6"}
	const ops = 8
	answers := make([]*httptest.ResponseRecorder, ops)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range ops {
		// Each operation carries the items in another order.
		order := append(append([]string(nil), keys[i%len(keys):]...), keys[:i%len(keys)]...)
		wg.Go(func() {
			<-start
			answers[i] = post(f.h, fmt.Sprintf("op-%d", i), items(order...))
		})
	}
	close(start)
	wg.Wait()
	accepted := map[string]int{}
	ids := map[string]int64{}
	for _, a := range answers {
		require.Equal(t, http.StatusOK, a.Code, a.Body.String())
		for _, r := range results(t, a) {
			if r.Status == "accepted" {
				accepted[r.ItemKey]++
			}
			if prev, ok := ids[r.ItemKey]; ok {
				require.Equal(t, prev, r.PaymentID, "every operation names one payment per item")
			}
			ids[r.ItemKey] = r.PaymentID
		}
	}
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		require.Equal(t, 1, accepted[k], k)
		require.EqualValues(t, 1, f.runsOf(k), k)
	}
	require.Equal(t, 6, f.count())
}

func TestMalformedOrOversizedBulkIsRefusedAndNothingIsKept(t *testing.T) {
	t.Parallel()
	f := newBulkFixture(t, httpinbox.Config{}, httpinbox.Bulk{MaxItems: 3})
	requireProblem(t, post(f.h, "op-1", items("a=1", "b=2", "c=3", "d=4")), http.StatusRequestEntityTooLarge, httpinbox.CodeTooManyItems)
	for name, body := range map[string]string{
		"not JSON":        `items`,
		"no items":        `{"items":[]}`,
		"items not array": `{"items":{"itemKey":"a"}}`,
		"other member":    `{"items":[{"itemKey":"a","amount":1}],"dryRun":true}`,
		"Items":           `{"Items":[{"itemKey":"a","amount":1}]}`,
		"no item key":     `{"items":[{"amount":1}]}`,
		"ItemKey":         `{"items":[{"ItemKey":"a","amount":1}]}`,
		"number key":      `{"items":[{"itemKey":1,"amount":1}]}`,
		"bad key":         `{"items":[{"itemKey":"a b","amount":1}]}`,
		"not an object":   `{"items":["a"]}`,
		"duplicate key":   items("a=1", "a=2"),
	} {
		rec := post(f.h, "op-1", body)
		requireProblem(t, rec, http.StatusBadRequest, httpinbox.CodeValidationFailed)
		require.Zero(t, f.records(), name)
	}
	require.Zero(t, f.runs.Load())
	require.Equal(t, http.StatusOK, post(f.h, "op-1", items("a=1", "b=2", "c=3")).Code, "the key stays usable")
	require.Panics(t, func() { f.m.Bulk(httpinbox.Bulk{Operation: "x", MaxItems: httpinbox.MaxBulkItems + 1}, f.item) })
	require.Panics(t, func() { f.m.Bulk(httpinbox.Bulk{Operation: "x", ItemOperation: "x"}, f.item) })
}
