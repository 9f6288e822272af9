package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

// bulkJSON is a POST /captures:bulk body of "itemKey=amount" items.
func bulkJSON(items ...string) string {
	var parts []string
	for _, it := range items {
		k, amount, _ := strings.Cut(it, "=")
		parts = append(parts, fmt.Sprintf(`{"itemKey":%q,"orderId":"o-%s","amount":%s,"currency":"EUR"}`, k, k, amount))
	}
	return `{"items":[` + strings.Join(parts, ",") + `]}`
}

// postBulk sends POST /captures:bulk to the running API.
func (e *apiEnv) postBulk(tenant, caller, key, body string) reply {
	e.t.Helper()
	req := newCaptureRequest(e.url, tenant, caller, key, body)
	req.URL.Path = "/captures:bulk"
	return e.do(req)
}

type bulkResult struct {
	ItemKey          string          `json:"itemKey"`
	Status           string          `json:"status"`
	CaptureRequestID string          `json:"captureRequestId"`
	Location         string          `json:"location"`
	Problem          json.RawMessage `json:"problem"`
}

func (r reply) items(t *testing.T) []bulkResult {
	t.Helper()
	var out struct{ Items []bulkResult }
	require.NoError(t, json.Unmarshal(r.body, &out), string(r.body))
	return out.Items
}

func TestBulkCapturesChargeEachAcceptedItemOnce(t *testing.T) {
	t.Parallel()
	w := newEnv(t, faults{}, nil, nil)
	e := startAPI(t, w.pool, w.tables, w.queue, nil)

	first := e.postBulk("acme", "alice", "bulk-1", bulkJSON("c-1=100", "c-2=200", "c-3=0"))
	require.Equal(t, http.StatusMultiStatus, first.status, string(first.body))
	rs := first.items(t)
	require.Len(t, rs, 3)
	require.Equal(t, []string{"accepted", "accepted", "rejected"}, []string{rs[0].Status, rs[1].Status, rs[2].Status})
	require.Contains(t, string(rs[2].Problem), "amount 0 is not positive")
	c1, c2 := rs[0].CaptureRequestID, rs[1].CaptureRequestID
	require.Equal(t, "cr_"+httpinbox.KeyID("acme", "alice", bulkOperation+".item", "c-1")[:24], c1)
	require.Equal(t, "/captures/"+c2, rs[1].Location)

	// The same operation again: the same bytes; changed: refused.
	again := e.postBulk("acme", "alice", "bulk-1", bulkJSON("c-1=100", "c-2=200", "c-3=0"))
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(httpinbox.HeaderReplayed))
	e.postBulk("acme", "alice", "bulk-1", bulkJSON("c-1=100", "c-2=200", "c-3=300")).
		requireProblem(t, http.StatusUnprocessableEntity, httpinbox.CodeKeyReused)

	// A new operation with the rejected item fixed, one accepted item again,
	// and a new one: only the new work runs.
	second := e.postBulk("acme", "alice", "bulk-2", bulkJSON("c-2=200", "c-3=300", "c-4=400"))
	require.Equal(t, http.StatusOK, second.status, string(second.body))
	rs = second.items(t)
	require.Equal(t, []string{"already_accepted", "accepted", "accepted"}, []string{rs[0].Status, rs[1].Status, rs[2].Status})
	require.Equal(t, c2, rs[0].CaptureRequestID, "c-2's original captureRequestId")
	ids := []string{c1, c2, rs[1].CaptureRequestID, rs[2].CaptureRequestID}

	for _, id := range ids {
		require.Equal(t, ledger.StatusSucceeded, w.waitEffect(id).Status, id)
	}
	waitFor(t, "every bulk capture to report succeeded", func() bool {
		for _, id := range ids {
			if e.get("acme", "alice", id).doc(t).State != "succeeded" {
				return false
			}
		}
		return true
	})
	g := w.gateway.snapshot()
	require.Equal(t, int64(4), g.Charges)
	require.Equal(t, int64(4), g.DistinctCaptures)
	require.Zero(t, g.DoubleCharges)
	require.Equal(t, 4, e.apiCaptures())
	require.Equal(t, 4, e.outbox())
	require.Equal(t, 4, w.payments())
	require.Equal(t, http.StatusNotFound, e.get("acme", "bob", c1).status, "another caller cannot read it")
}
