package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/httpinbox"
)

// edgeExpiry is how long an Idempotency-Key protects its request at the
// HTTP edge: shorter than a cleanup's wait, so that a retry after one is
// answered 422 IDEMPOTENCY_KEY_EXPIRED.
const edgeExpiry = 3 * time.Second

// runEdge is `chaos edge`: the HTTP edge under test in a process of its
// own, an endpoint behind the Idempotency-Key middleware, with its
// database through the PostgreSQL fault proxy like the workers'. It
// serves until ctx ends or it is killed.
func runEdge(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	schema := fs.String("schema", "", "schema of idem's tables and the chaos tables")
	pgURL := fs.String("pg-url", "", "PostgreSQL")
	addr := fs.String("addr", "", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return exitNotRun
	}
	if err := serveEdge(ctx, *pgURL, idem.Tables{Schema: *schema}, *addr); err != nil {
		fmt.Fprintln(stderr, "chaos edge:", err)
		return exitFail
	}
	return exitPass
}

func serveEdge(ctx context.Context, pgURL string, tables idem.Tables, addr string) error {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return fmt.Errorf("chaos: edge pool: %w", err)
	}
	defer pool.Close()
	m, err := httpinbox.New(pool, httpinbox.Config{Tables: tables, Expiry: edgeExpiry, Lease: 2 * time.Second,
		Caller: func(r *http.Request) string { return r.Header.Get("X-Caller") }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return fmt.Errorf("chaos: edge: %w", err)
	}
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.chaos_http (key, amount) VALUES ($1, $2) RETURNING n`
	mux := http.NewServeMux()
	mux.Handle("POST /deposits", m.Handle(httpinbox.Route{Operation: "deposits.create"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			var d struct {
				Amount int64 `json:"amount"`
			}
			if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
				return httpinbox.Response{}, httpinbox.Invalid(err)
			}
			if ms, err := strconv.Atoi(r.Header.Get("X-Chaos-Delay")); err == nil && ms > 0 {
				select { // the handler is slow: a kill lands in it
				case <-ctx.Done():
					return httpinbox.Response{}, ctx.Err()
				case <-time.After(time.Duration(ms) * time.Millisecond):
				}
			}
			var n int64
			if err := tx.QueryRow(ctx, insert, r.Header.Get("Idempotency-Key"), d.Amount).Scan(&n); err != nil {
				return httpinbox.Response{}, err
			}
			return httpinbox.Response{Status: http.StatusCreated, Body: []byte(fmt.Sprintf(`{"n":%d,"amount":%d}`, n, d.Amount))}, nil
		}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("chaos: edge: listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }() // owned: ends with Shutdown below
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-done
	return nil
}

// edge is the runner's client of the edge process at addr.
type edge struct {
	addr   string
	client *http.Client
}

func newEdge(addr string) *edge {
	return &edge{addr: addr, client: &http.Client{Timeout: 5 * time.Second}}
}

// waitUp waits (at most 15s) until the edge accepts connections.
func (e *edge) waitUp(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		c, err := net.DialTimeout("tcp", e.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("chaos: the edge at %s did not listen within 15s", e.addr)
}

// answer is what one request to the edge got: status 0 when none came.
type answer struct {
	amount int64
	status int
	body   string
}

// post sends one request with key and amount.
func (e *edge) post(key string, amount int64) answer { return e.postSlow(key, amount, 0) }

// postSlow sends one request with key and amount whose handler takes
// delay before it writes.
func (e *edge) postSlow(key string, amount int64, delay time.Duration) answer {
	a := answer{amount: amount}
	req, err := http.NewRequest(http.MethodPost, "http://"+e.addr+"/deposits",
		bytes.NewReader([]byte(fmt.Sprintf(`{"amount":%d}`, amount))))
	if err != nil {
		return a
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Caller", "chaos")
	if delay > 0 {
		req.Header.Set("X-Chaos-Delay", strconv.Itoa(int(delay/time.Millisecond)))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return a
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a.status, a.body = resp.StatusCode, string(b)
	return a
}

// race sends two requests with key and amount at once.
func (e *edge) race(key string, amount int64) [2]answer {
	var out [2]answer
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() { // owned: waited for below; each request has the client's timeout
			defer wg.Done()
			out[i] = e.post(key, amount)
		}()
	}
	wg.Wait()
	return out
}

// expired sends an earlier request again once its key expired: refused
// 422 IDEMPOTENCY_KEY_EXPIRED, its handler not run again, when its key
// had completed. Its expiry is read from the key's row (a request stalled
// by an outage may have completed it later than its client gave up).
func (r *runner) expired(ctx context.Context, a Action) error {
	amount, ok := r.model.keyAmount[a.Ref]
	if !ok {
		return nil
	}
	until := time.Now().Add(edgeExpiry + 10*time.Second)
	completed := false
	for time.Now().Before(until) && ctx.Err() == nil {
		var state string
		var left float64 // seconds until the key expires, by the database's clock
		err := r.pool.QueryRow(ctx, `SELECT state, extract(epoch FROM expires_at - now()) FROM `+r.tables.Table("http_keys")+
			` WHERE idempotency_key = $1`, a.Ref).Scan(&state, &left)
		if err != nil || left < -0.2 {
			completed = err == nil && state == "completed"
			break
		}
		time.Sleep(min(time.Duration(left*float64(time.Second))+250*time.Millisecond, time.Second))
	}
	ans := r.edge.post(a.Ref, amount)
	r.model.lastAt[a.Ref] = time.Now()
	r.model.answers[a.Ref] = append(r.model.answers[a.Ref], ans)
	if !completed || ans.status == 0 || ans.status == http.StatusServiceUnavailable {
		return nil // a key whose request never completed runs again; an outage answers 503 or nothing
	}
	r.door("expired key sent again")
	r.obs.note(func(o *observations) {
		o.checks = append(o.checks, check{invExpired, ans.status == 422 && strings.Contains(ans.body, "IDEMPOTENCY_KEY_EXPIRED"),
			fmt.Sprintf("key %s past its expiry: %d %q", a.Ref, ans.status, ans.body)})
	})
	return nil
}

// edgeKillDelay is how long the handler of a kill_edge's first request
// takes: the kill lands before, in or after it.
const edgeKillDelay = 150 * time.Millisecond

// killEdge sends a request with a new key, kills the edge process under
// it after a.Millis, starts it again, and retries the request as a
// client would until it gets a definite answer.
func (r *runner) killEdge(ctx context.Context, a Action) error {
	m := r.model
	m.keyAmount[a.ID] = a.Amount
	first := make(chan answer, 1)
	go func() { first <- r.edge.postSlow(a.ID, a.Amount, edgeKillDelay) }() // owned: bounded by the client's timeout, waited for below
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(a.Millis) * time.Millisecond):
	}
	if err := r.procs[edgeProc].kill(); err != nil {
		return err
	}
	ans := <-first
	m.answers[a.ID] = append(m.answers[a.ID], ans)
	if ans.status == 0 {
		r.door("edge killed under a request")
	} else {
		r.door("edge killed after its answer")
	}
	if err := r.edge.waitUp(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil && (ans.status < 200 || ans.status > 299) {
		time.Sleep(300 * time.Millisecond)
		ans = r.edge.post(a.ID, a.Amount)
		m.answers[a.ID] = append(m.answers[a.ID], ans)
	}
	m.lastAt[a.ID] = time.Now()
	if !r.pgOut {
		r.obs.note(func(o *observations) {
			o.checks = append(o.checks, check{invEdgeKill, ans.status >= 200 && ans.status <= 299,
				fmt.Sprintf("key %s, its edge killed after %dms: the retries ended with %d %q", a.ID, a.Millis, ans.status, ans.body)})
		})
	}
	return nil
}
