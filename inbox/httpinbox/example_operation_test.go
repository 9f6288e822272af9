package httpinbox_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// A report takes long to build: the request is answered 202 with where to
// ask, and a worker elsewhere moves the operation until the status says it
// is done.
func ExampleMiddleware_Accept() {
	ctx := context.Background()
	pool, tables, done := exampleenv.DB(ctx, "operation", nil)
	defer done()
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: tables, Logger: slog.New(slog.DiscardHandler),
		Caller: func(r *http.Request) string { return "demo-user" }}) // in production: the authenticated principal
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /reports", m.Handle(httpinbox.Route{Operation: "reports.create"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			// Record the work to do (an outbox effect, a job row) in tx, then:
			return m.Accept(ctx, tx, httpinbox.Accepted{ID: "rep-1", Location: "/operations/rep-1",
				Fields: map[string]string{"report": "2025-q1"}})
		}))
	mux.Handle("GET /operations/{id}", m.OperationStatus())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	show := func(resp *http.Response, err error) {
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d Location=%q Retry-After=%q %s\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Retry-After"), b)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/reports", nil)
	req.Header.Set("Idempotency-Key", "report-2025-q1")
	show(http.DefaultClient.Do(req))
	show(http.Get(srv.URL + "/operations/rep-1"))

	// The worker that builds the report, in its own process and transaction.
	ops, err := httpinbox.NewOperations(pool, tables)
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ops.Start(ctx, tx, "rep-1"); err != nil {
			return err
		}
		return ops.Finish(ctx, tx, "rep-1", httpinbox.OperationSucceeded, map[string]string{"url": "/reports/2025-q1.pdf"})
	})
	if err != nil {
		log.Fatal(err)
	}
	show(http.Get(srv.URL + "/operations/rep-1"))
	// Output:
	// 202 Location="/operations/rep-1" Retry-After="1" {"operationId":"rep-1","state":"accepted","report":"2025-q1"}
	// 200 Location="" Retry-After="1" {"operationId":"rep-1","state":"accepted","report":"2025-q1"}
	// 200 Location="" Retry-After="" {"operationId":"rep-1","state":"succeeded","report":"2025-q1","result":{"url":"/reports/2025-q1.pdf"}}
}
