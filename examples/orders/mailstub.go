package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// mailbox is a stub mail service: it counts the e-mails it receives and
// deduplicates them by Idempotency-Key, like a real provider would.
type mailbox struct {
	mu       sync.Mutex
	received int
	byKey    map[string]int
	orders   map[string]int
}

func newMailbox() *mailbox { return &mailbox{byKey: map[string]int{}, orders: map[string]int{}} }

// mailStats is what GET /stats returns.
type mailStats struct {
	// Received counts the requests, retries included.
	Received int `json:"received"`
	// Distinct counts the distinct idempotency keys: the e-mails sent.
	Distinct int `json:"distinct"`
}

func (b *mailbox) stats() mailStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return mailStats{Received: b.received, Distinct: len(b.byKey)}
}

// sent returns how many distinct e-mails each order got.
func (b *mailbox) sent() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.orders))
	for k, v := range b.orders {
		out[k] = v
	}
	return out
}

func (b *mailbox) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /send", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		var req struct {
			OrderID string `json:"orderId"`
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil || key == "" || json.Unmarshal(body, &req) != nil || req.OrderID == "" {
			http.Error(w, "want a JSON body with orderId and an Idempotency-Key", http.StatusBadRequest)
			return
		}
		b.mu.Lock()
		b.received++
		if b.byKey[key]++; b.byKey[key] == 1 {
			b.orders[req.OrderID]++
		}
		b.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"queued"}`)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(b.stats())
	})
	return mux
}

func mailstubCommand(ctx context.Context, o options, args []string) error {
	fs := flag.NewFlagSet("orders mailstub", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8025", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	b := newMailbox()
	srv := &http.Server{Handler: b.handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	o.logger.Info("mail stub listening", "url", "http://"+ln.Addr().String()+"/send")
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	var last mailStats
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			if s := b.stats(); s != last {
				o.logger.Info("mail stub", slog.Int("received", s.Received), slog.Int("distinct", s.Distinct))
				last = s
			}
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := srv.Shutdown(sctx)
			if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			s := b.stats()
			o.logger.Info("mail stub stopped", "received", s.Received, "distinct", s.Distinct)
			return err
		}
	}
}
