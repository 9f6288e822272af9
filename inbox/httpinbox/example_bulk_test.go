package httpinbox_test

import (
	"context"
	"encoding/json"
	"errors"
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

// A bulk of captures with an operation key and a key per item: the item
// refused the first time goes again in a new operation, without its
// accepted neighbour running twice.
func ExampleMiddleware_Bulk() {
	ctx := context.Background()
	pool, tables, done := exampleenv.DB(ctx, "bulk", func(s string) string {
		return "CREATE TABLE " + s + ".captures (id text PRIMARY KEY, amount bigint NOT NULL)"
	})
	defer done()
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: tables, Logger: slog.New(slog.DiscardHandler),
		Caller: func(r *http.Request) string { return "demo-user" }}) // in production: the authenticated principal
	if err != nil {
		log.Fatal(err)
	}
	captures := pgx.Identifier{tables.Schema, "captures"}.Sanitize()

	mux := http.NewServeMux()
	mux.Handle("POST /captures:bulk", m.Bulk(httpinbox.Bulk{Operation: "captures.bulk", MaxItems: 100},
		func(ctx context.Context, tx pgx.Tx, item json.RawMessage) (any, error) {
			var c struct {
				Amount int64 `json:"amount"`
			}
			if err := json.Unmarshal(item, &c); err != nil || c.Amount <= 0 {
				return nil, httpinbox.Invalid(errors.New("amount must be a positive integer"))
			}
			// The item key's id, not the operation's: the same capture whichever operation carries it.
			id := "cap_" + httpinbox.FromContext(ctx).KeyID()[:8]
			if _, err := tx.Exec(ctx, "INSERT INTO "+captures+" (id, amount) VALUES ($1, $2)", id, c.Amount); err != nil {
				return nil, err
			}
			return map[string]string{"captureId": id}, nil
		}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(opKey, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/captures:bulk", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", opKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(b))
	}
	send("op-1", `{"items":[{"itemKey":"a","amount":100},{"itemKey":"b","amount":0}]}`)
	send("op-2", `{"items":[{"itemKey":"a","amount":100},{"itemKey":"b","amount":250}]}`)

	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+captures).Scan(&n)
	fmt.Println("captures:", n)
	// Output:
	// 207 {"items":[{"itemKey":"a","status":"accepted","captureId":"cap_cae8b92a"},{"itemKey":"b","status":"rejected","problem":{"type":"urn:idem:problem:validation-failed","title":"Bad Request","status":400,"detail":"amount must be a positive integer","code":"VALIDATION_FAILED"}}]}
	// 200 {"items":[{"itemKey":"a","status":"already_accepted","captureId":"cap_cae8b92a"},{"itemKey":"b","status":"accepted","captureId":"cap_a862dd0f"}]}
	// captures: 2
}
