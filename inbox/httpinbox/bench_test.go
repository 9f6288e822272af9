package httpinbox_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// benchBody is the request every benchmark sends.
const benchBody = `{"amount": 250, "currency": "EUR", "reference": "invoice 2026-0042"}`

// benchSetup returns a middleware on a fresh schema, the payments table and
// the business write both variants perform.
func benchSetup(b *testing.B) (*httpinbox.Middleware, *pgxpool.Pool, func(ctx context.Context, tx pgx.Tx, keyID string) (httpinbox.Response, error)) {
	pool, tables := testdb.Schema(b)
	payments := pgx.Identifier{tables.Schema, "payments"}.Sanitize()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+payments+
		` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: tables, SharedScope: true})
	if err != nil {
		b.Fatal(err)
	}
	write := func(ctx context.Context, tx pgx.Tx, keyID string) (httpinbox.Response, error) {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+payments+` (key_id, amount) VALUES ($1, 250) RETURNING id`, keyID).Scan(&id); err != nil {
			return httpinbox.Response{}, err
		}
		return httpinbox.JSON(http.StatusCreated, map[string]any{"id": id, "amount": 250})
	}
	return m, pool, write
}

// baseline is the same business write without the middleware: one
// transaction, the insert, commit, the JSON answer.
func baseline(pool *pgxpool.Pool, write func(context.Context, pgx.Tx, string) (httpinbox.Response, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var resp httpinbox.Response
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			var err error
			resp, err = write(r.Context(), tx, r.Header.Get(httpinbox.HeaderKey))
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	})
}

// serve runs b.N requests through h from parallel goroutines; key returns
// the key of the i-th request.
func serve(b *testing.B, h http.Handler, key func(i int64) string, want int) {
	var n atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(benchBody))
			req.Header.Set(httpinbox.HeaderKey, key(n.Add(1)))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != want {
				b.Errorf("status %d: %s", rec.Code, rec.Body)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkFirstRequest: every request has a new key, so the middleware
// claims it, runs the handler, stores the response and commits.
func BenchmarkFirstRequest(b *testing.B) {
	unique := func(i int64) string { return fmt.Sprintf("first-%d", i) }
	b.Run("baseline", func(b *testing.B) {
		_, pool, write := benchSetup(b)
		serve(b, baseline(pool, write), unique, http.StatusCreated)
	})
	b.Run("httpinbox", func(b *testing.B) {
		m, _, write := benchSetup(b)
		h := m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			return write(ctx, tx, httpinbox.FromContext(ctx).KeyID())
		})
		serve(b, h, unique, http.StatusCreated)
	})
}

// BenchmarkReplay: every request repeats one key, so the middleware answers
// from the stored response; the baseline performs the business write again.
func BenchmarkReplay(b *testing.B) {
	same := func(int64) string { return "replayed-key" }
	b.Run("baseline", func(b *testing.B) {
		_, pool, write := benchSetup(b)
		serve(b, baseline(pool, write), same, http.StatusCreated)
	})
	b.Run("httpinbox", func(b *testing.B) {
		m, _, write := benchSetup(b)
		h := m.Handle(httpinbox.Route{Operation: "payments.create"}, func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			return write(ctx, tx, httpinbox.FromContext(ctx).KeyID())
		})
		first := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(benchBody))
		first.Header.Set(httpinbox.HeaderKey, "replayed-key")
		h.ServeHTTP(httptest.NewRecorder(), first)
		serve(b, h, same, http.StatusCreated)
	})
}
