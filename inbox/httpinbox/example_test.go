package httpinbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// A payments endpoint behind the middleware: the first request runs the
// handler, a retry with the same key receives the stored response, and the
// key reused for a different request is refused.
func Example() {
	ctx := context.Background()
	pool, tables, done := exampleenv.DB(ctx, "httpinbox", func(s string) string {
		return "CREATE TABLE " + s + ".payments (id text PRIMARY KEY, amount bigint NOT NULL)"
	})
	defer done()
	payments := pgx.Identifier{tables.Schema, "payments"}.Sanitize()

	m, err := httpinbox.New(pool, httpinbox.Config{
		Tables: tables,
		Logger: slog.New(slog.DiscardHandler),
		// In production: the authenticated principal, never a client header.
		Caller: func(r *http.Request) string { return "demo-user" },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Handle(httpinbox.Route{Operation: "payments.create"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			var req struct {
				Amount int64 `json:"amount"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
				return httpinbox.Response{}, httpinbox.Invalid(fmt.Errorf("amount must be a positive integer"))
			}
			// The payment's identity comes from the key, so a re-run after a
			// crash creates the same payment, never a second one.
			id := "pay_" + httpinbox.FromContext(ctx).KeyID()[:12]
			if _, err := tx.Exec(ctx, "INSERT INTO "+payments+" (id, amount) VALUES ($1, $2)", id, req.Amount); err != nil {
				return httpinbox.Response{}, err
			}
			resp, err := httpinbox.JSON(http.StatusCreated, map[string]any{"id": id, "amount": req.Amount})
			resp.ResourceID = id
			return resp, err
		}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "order-1001")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	send(`{"amount": 250}`)
	send(`{ "amount": 250 }`) // a retry: same request, different spelling
	send(`{"amount": 300}`)   // the key reused for another request

	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+payments).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed="" {"amount":250,"id":"pay_2cc2a9c2c460"}
	// 201 replayed="true" {"amount":250,"id":"pay_2cc2a9c2c460"}
	// 422 replayed="" {"type":"urn:idem:problem:idempotency-key-reused-with-different-request","title":"Unprocessable Entity","status":422,"detail":"this Idempotency-Key was used with a different request","code":"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"}
	// payments: 1
}

func ExampleProblem() {
	p := httpinbox.Problem(http.StatusPaymentRequired, "INSUFFICIENT_FUNDS", "the card was declined")
	fmt.Println(p.Status, p.Header.Get("Content-Type"))
	fmt.Println(string(p.Body))
	// Output:
	// 402 application/problem+json
	// {"type":"urn:idem:problem:insufficient-funds","title":"Payment Required","status":402,"detail":"the card was declined","code":"INSUFFICIENT_FUNDS"}
}

func ExampleKeyID() {
	// The same scope always has the same id: use it as the identity of the
	// events and ledger effects the request causes.
	fmt.Println(httpinbox.KeyID("acme", "user-42", "payments.create", "order-1001"))
	fmt.Println(httpinbox.KeyID("acme", "user-42", "payments.create", "order-1001") ==
		httpinbox.KeyID("acme", "user-43", "payments.create", "order-1001"))
	// Output:
	// a8ec0219fc6aa37fcc8c0b10e6d4ef07d3e61c1b8bc8e1c8c07c1993da567af3
	// false
}
