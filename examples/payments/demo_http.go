package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

// httpDemoConfig says what the demo sends to the API.
type httpDemoConfig struct {
	// n is the number of distinct Idempotency-Keys.
	n int
	// dup is the fraction of keys sent three times at once.
	dup float64
	// retry is the fraction of keys sent again after their answer.
	retry float64
}

// httpReport is what the demo's HTTP clients were answered, and what became
// of the capture requests the API accepted.
type httpReport struct {
	keys, requests int
	// outcomes counts the answers by status and kind.
	outcomes map[string]int
	// ids maps each accepted key to the captureRequestId of its first 202.
	ids map[string]string
	// mismatches counts 202s naming another captureRequestId than their
	// key's first.
	mismatches int
	// reuse is the status answered to a key sent again with another amount.
	reuse int
	// payments, published and captured are read once everything settled:
	// the payment rows, outbox messages and capture effects of ids.
	payments            int
	published, captured map[ledger.Status]int
}

// demoTenant and demoCaller are the scope of the demo's keys.
const demoTenant, demoCaller = "demo", "demo-client"

// sendHTTP sends cfg.n capture requests to the API, each with a key of its
// own: some three times at once, some again after their answer, and the
// first key once more with another amount.
func sendHTTP(ctx context.Context, cfg httpDemoConfig, apiURL, prefix string) (httpReport, error) {
	rep := httpReport{keys: cfg.n, outcomes: map[string]int{}, ids: map[string]string{}}
	client := &http.Client{Timeout: 30 * time.Second}
	var mu sync.Mutex
	send := func(key string, amount int) (int, error) {
		status, label, id, err := postCapture(ctx, client, apiURL, key, amount)
		if err != nil {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		rep.requests++
		rep.outcomes[label]++
		if status == http.StatusAccepted {
			if first, ok := rep.ids[key]; !ok {
				rep.ids[key] = id
			} else if first != id {
				rep.mismatches++
			}
		}
		return status, nil
	}
	sendKey := func(i int) error {
		key, amount := fmt.Sprintf("%s-key-%d", prefix, i), 100+i
		copies := 1
		if mrand.Float64() < cfg.dup {
			copies = 3
		}
		errs := make(chan error, copies)
		var wg sync.WaitGroup
		for range copies {
			wg.Go(func() {
				_, err := send(key, amount)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		if mrand.Float64() < cfg.retry {
			_, err := send(key, amount)
			return err
		}
		return nil
	}

	next := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := sendKey(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range cfg.n {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	err = errors.Join(err, <-errs)
	if err != nil {
		return rep, err
	}
	rep.reuse, err = send(fmt.Sprintf("%s-key-0", prefix), 100+1) // key 0 was sent with amount 100
	return rep, err
}

// postCapture sends one POST /captures and labels the answer.
func postCapture(ctx context.Context, client *http.Client, apiURL, key string, amount int) (status int, label, id string, err error) {
	body := fmt.Sprintf(`{"orderId":%q,"amount":%d,"currency":"EUR"}`, "o-"+key, amount)
	status, header, b, err := postDemo(ctx, client, apiURL+"/captures", key, body)
	if err != nil {
		return 0, "", "", err
	}
	var answer struct {
		CaptureRequestID string `json:"captureRequestId"`
		Code             string `json:"code"`
	}
	if err := json.Unmarshal(b, &answer); err != nil {
		return 0, "", "", fmt.Errorf("demo: POST /captures answered %d: %w", status, err)
	}
	switch {
	case status == http.StatusAccepted && header.Get("Idempotent-Replayed") == "true":
		label = "202 replayed"
	case status == http.StatusAccepted:
		label = "202 new"
	case answer.Code == httpinbox.CodeInProgress:
		label = "409 in progress"
	case answer.Code == httpinbox.CodeKeyReused:
		label = "422 key reused"
	default:
		label = fmt.Sprintf("%d %s", status, answer.Code)
	}
	return status, label, answer.CaptureRequestID, nil
}

// captureRequestIDs returns the accepted captureRequestIds (never nil).
func (h httpReport) captureRequestIDs() []string {
	ids := make([]string, 0, len(h.ids))
	for _, id := range h.ids {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// settle reads the payment rows, outbox messages and capture effects of the
// accepted capture requests.
func (h *httpReport) settle(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) error {
	ids := h.captureRequestIDs()
	var err error
	if h.payments, err = count(ctx, pool, `SELECT count(*) FROM `+paymentsTable(tables)+
		` WHERE capture_request_id = ANY($1)`, ids); err != nil {
		return err
	}
	byType := `SELECT status, count(*) FROM ` + tables.Table("ledger") +
		` WHERE effect_type = $1 AND business_key = ANY($2) GROUP BY status`
	if h.published, err = groupCount[ledger.Status](ctx, pool, byType, effectCaptureRequested, ids); err != nil {
		return err
	}
	h.captured, err = groupCount[ledger.Status](ctx, pool, byType, effectCapture, ids)
	return err
}

// checks are the HTTP edge's lines of the verdict.
func (h httpReport) checks() []check {
	n := len(h.ids)
	distinct := map[string]bool{}
	for _, id := range h.ids {
		distinct[id] = true
	}
	return []check{
		{n == h.keys && len(distinct) == n && h.mismatches == 0, fmt.Sprintf(
			"one captureRequestId per Idempotency-Key (%d keys, %d accepted, %d ids, %d answers naming another id)",
			h.keys, n, len(distinct), h.mismatches)},
		{h.reuse == http.StatusUnprocessableEntity, fmt.Sprintf("a key reused with another amount answered 422 (got %d)", h.reuse)},
		{h.published[ledger.StatusSucceeded] == n && total(h.published) == n,
			fmt.Sprintf("one outbox message per accepted key (%d published of %d)", h.published[ledger.StatusSucceeded], n)},
		{h.payments == n && h.captured[ledger.StatusSucceeded] == n && total(h.captured) == n,
			fmt.Sprintf("one payment row and one succeeded capture per accepted key (%d rows, %d captured, %d keys)",
				h.payments, h.captured[ledger.StatusSucceeded], n)},
	}
}
