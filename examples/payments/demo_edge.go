package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
)

// The demo's run of the edge's other patterns: bulk operations that overlap
// and retry rejected items, the gateway's webhooks with duplicates and
// retries next to forged ones, and the status of every capture request.

// edgeDemoConfig says what the demo sends besides single captures.
type edgeDemoConfig struct {
	// bulkOps is the number of bulk operations, bulkWindow items each, every
	// one carrying the last bulkOverlap items of the one before.
	bulkOps int
	// secret signs the gateway's webhooks (default: a random one);
	// dupRate is its webhook-dup-rate.
	secret  []byte
	dupRate float64
}

const (
	bulkWindow  = 5
	bulkOverlap = 2
)

// edgeReport is what the edge answered and what became of it.
type edgeReport struct {
	// items counts the bulk items' statuses; ids maps each accepted item
	// key to its captureRequestId; mismatches counts already_accepted items
	// naming another one.
	items      map[string]int
	ids        map[string]string
	mismatches int
	// replayed says whether the first operation, sent again, got the same
	// bytes; changed is the status of it sent with another body.
	replayed bool
	changed  int
	// forged counts the answers to unsigned, forged and stale webhooks.
	forged map[int]int
	// states counts the status of every accepted capture request, read from
	// GET /captures/{id} once everything settled.
	states map[string]int
	// rows and distinct count gateway_events rows and event ids.
	rows, distinct int
}

// bulkItemJSON is item j of the demo's bulk operations: invalid (amount 0)
// in the first operation that carries it when j%7 == 3, fixed in the next.
func bulkItemJSON(prefix string, j int, first bool) string {
	amount := 100 + j
	if first && j%7 == 3 {
		amount = 0
	}
	return fmt.Sprintf(`{"itemKey":"%s-item-%d","orderId":"o-%s-bulk-%d","amount":%d,"currency":"EUR"}`, prefix, j, prefix, j, amount)
}

// bulkBody is bulk operation i.
func bulkBody(prefix string, i int) string {
	var items []string
	start := i * (bulkWindow - bulkOverlap)
	for j := start; j < start+bulkWindow; j++ {
		items = append(items, bulkItemJSON(prefix, j, i == 0 || j >= start+bulkOverlap))
	}
	return `{"items":[` + strings.Join(items, ",") + `]}`
}

// sendBulk sends the bulk operations one after the other, then the first
// again and the first with another body.
func sendBulk(ctx context.Context, cfg edgeDemoConfig, client *http.Client, apiURL, prefix string) (edgeReport, error) {
	rep := edgeReport{items: map[string]int{}, ids: map[string]string{}}
	var first []byte
	for i := range cfg.bulkOps {
		status, _, body, err := postDemo(ctx, client, apiURL+"/captures:bulk", fmt.Sprintf("%s-bulk-%d", prefix, i), bulkBody(prefix, i))
		if err != nil {
			return rep, err
		}
		if i == 0 {
			first = body
		}
		var answer struct {
			Items []struct{ ItemKey, Status, CaptureRequestID string }
		}
		if err := json.Unmarshal(body, &answer); err != nil {
			return rep, fmt.Errorf("demo: POST /captures:bulk answered %d: %w", status, err)
		}
		for _, it := range answer.Items {
			rep.items[it.Status]++
			switch prev, ok := rep.ids[it.ItemKey]; {
			case it.Status == string(httpinbox.ItemAccepted) && !ok:
				rep.ids[it.ItemKey] = it.CaptureRequestID
			case it.Status != string(httpinbox.ItemRejected) && prev != it.CaptureRequestID:
				rep.mismatches++
			}
		}
	}
	if cfg.bulkOps == 0 {
		return rep, nil
	}
	key := prefix + "-bulk-0"
	_, _, again, err := postDemo(ctx, client, apiURL+"/captures:bulk", key, bulkBody(prefix, 0))
	if err != nil {
		return rep, err
	}
	rep.replayed = bytes.Equal(first, again)
	rep.changed, _, _, err = postDemo(ctx, client, apiURL+"/captures:bulk", key, bulkBody(prefix, 1))
	return rep, err
}

// sendForgedWebhooks sends a capture.settled event unsigned, signed with
// another secret and signed too long ago, and counts the answers.
func sendForgedWebhooks(ctx context.Context, cfg edgeDemoConfig, client *http.Client, apiURL, prefix string) (map[int]int, error) {
	body := []byte(fmt.Sprintf(`{"id":"evt_%s_forged","type":"capture.settled","data":{"captureRequestId":"cr_forged"}}`, prefix))
	forger := gatewaySigner([]byte("not-the-secret"))
	out := map[int]int{}
	for _, sig := range []string{"", forger.Sign(body, time.Now()), gatewaySigner(cfg.secret).Sign(body, time.Now().Add(-time.Hour))} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/webhooks/gateway", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		if sig != "" {
			req.Header.Set(signatureHeader, sig)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("demo: POST /webhooks/gateway: %w", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		out[resp.StatusCode]++
	}
	return out, nil
}

// postDemo sends a POST with an Idempotency-Key as the demo's tenant and
// caller, and returns the answer's status, headers and body.
func postDemo(ctx context.Context, client *http.Client, url, key, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpinbox.HeaderKey, key)
	req.Header.Set(tenantHeader, demoTenant)
	req.Header.Set(callerHeader, demoCaller)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("demo: POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, b, err
}

// captureStates reads the status of every capture request in ids through
// GET /captures/{id}, as the demo's tenant and caller.
func captureStates(ctx context.Context, client *http.Client, apiURL string, ids []string) (map[string]int, error) {
	out := map[string]int{}
	for _, id := range ids {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/captures/"+id, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set(tenantHeader, demoTenant)
		req.Header.Set(callerHeader, demoCaller)
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("demo: GET /captures/%s: %w", id, err)
		}
		var doc struct{ State string }
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("demo: GET /captures/%s answered %d: %w", id, resp.StatusCode, err)
		}
		out[doc.State]++
	}
	return out, nil
}

// settle reads the gateway_events rows and the status of every accepted
// capture request, single or bulk.
func (r *edgeReport) settle(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, apiURL string, ids []string) error {
	var err error
	if r.rows, r.distinct, err = eventRows(ctx, pool, tables); err != nil {
		return err
	}
	r.states, err = captureStates(ctx, &http.Client{Timeout: 30 * time.Second}, apiURL, ids)
	return err
}

// captureRequestIDs returns the bulk's accepted captureRequestIds.
func (r edgeReport) captureRequestIDs() []string {
	ids := make([]string, 0, len(r.ids))
	for _, id := range r.ids {
		ids = append(ids, id)
	}
	return ids
}

// checks are the edge's lines of the verdict: g is the gateway's stats,
// accepted the number of capture requests the API accepted.
func (r edgeReport) checks(g gatewayStats, accepted int) []check {
	var checks []check
	if len(r.items) > 0 {
		distinct := map[string]bool{}
		for _, id := range r.ids {
			distinct[id] = true
		}
		checks = append(checks, check{len(distinct) == len(r.ids) && r.mismatches == 0 && r.items[string(httpinbox.ItemAccepted)] == len(r.ids), fmt.Sprintf(
			"bulk: each item key accepted once, then already_accepted with its captureRequestId (%s; %d ids, %d naming another)",
			describeCounts(r.items), len(distinct), r.mismatches)},
			check{r.replayed && r.changed == http.StatusUnprocessableEntity,
				fmt.Sprintf("bulk: an operation sent again replays its bytes, with another body 422 (same bytes %t, got %d)", r.replayed, r.changed)})
	}
	w := g.Webhooks
	return append(checks, []check{
		{w.Events == g.Charges && w.Delivered == w.Events && w.Failed == 0 && w.Dropped == 0,
			fmt.Sprintf("webhooks: one event per charge, every one delivered (%d events, %d charges, %d deliveries with %d duplicates and %d retries)",
				w.Events, g.Charges, w.Deliveries, w.Duplicates, w.Retries)},
		{int64(r.rows) == w.Events && r.distinct == r.rows,
			fmt.Sprintf("webhooks: one gateway_events row per event (%d rows, %d event ids)", r.rows, r.distinct)},
		{r.forged[http.StatusUnauthorized] == 3, fmt.Sprintf("webhooks: unsigned, forged and stale deliveries refused 401 (%v)", r.forged)},
		{r.states[string(httpinbox.OperationSucceeded)] == accepted,
			fmt.Sprintf("GET /captures/{id}: every accepted capture request succeeded (%s of %d)", describeCounts(r.states), accepted)},
	}...)
}
