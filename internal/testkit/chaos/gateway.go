package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// gateway is a fake payment gateway that does NOT deduplicate by key: every
// request it charges is a charge, so that a request sent twice shows as two.
// What it does with the first request under a key is the charge's
// behaviour (see the Behave constants); it answers later ones 200,
// charging again, but for an in-progress charge, whose first request
// already charged (the later one is the same request finishing).
type gateway struct {
	srv *http.Server
	ln  net.Listener

	mu      sync.Mutex
	charges map[string]int // by idempotency key: times charged
	seen    map[string]int // by idempotency key: requests
	behave  map[string]string
}

func startGateway() (*gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: gateway: listen: %w", err)
	}
	g := &gateway{ln: ln, charges: map[string]int{}, seen: map[string]int{}, behave: map[string]string{}}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = g.srv.Serve(ln) }() // owned: ends with close
	return g, nil
}

// URL is where the workers send charges.
func (g *gateway) URL() string { return "http://" + g.ln.Addr().String() + "/charges" }

func (g *gateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
}

// ServeHTTP charges (or not) and answers as the request's behaviour says.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req struct {
		Behave string `json:"behave"`
	}
	if key == "" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	g.seen[key]++
	first := g.seen[key] == 1
	g.behave[key] = req.Behave
	g.mu.Unlock()
	if !first {
		if req.Behave != BehaveInProgress {
			g.charge(key)
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	switch req.Behave {
	case Behave5xxBefore:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	case Behave5xxAfter:
		g.charge(key)
		w.WriteHeader(http.StatusBadGateway)
	case BehaveInProgress:
		g.charge(key)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"code":"IDEMPOTENCY_REQUEST_IN_PROGRESS"}`))
	case BehaveDropAfter:
		g.charge(key)
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		w.WriteHeader(http.StatusBadGateway)
	case BehaveTimeout:
		g.charge(key)
		select { // the caller has given up by then
		case <-r.Context().Done():
		case <-time.After(4 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	case BehaveSlow:
		time.Sleep(1500 * time.Millisecond)
		g.charge(key)
		w.WriteHeader(http.StatusOK)
	default:
		g.charge(key)
		w.WriteHeader(http.StatusOK)
	}
}

func (g *gateway) charge(key string) {
	g.mu.Lock()
	g.charges[key]++
	g.mu.Unlock()
}

// snapshot returns times charged by key.
func (g *gateway) snapshot() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.charges))
	for k, v := range g.charges {
		out[k] = v
	}
	return out
}
