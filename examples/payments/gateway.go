package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/run"
)

// faults is the trouble a gateway injects, each as a probability per request.
type faults struct {
	// FailRate answers 503 without charging.
	FailRate float64
	// SlowRate waits SlowDelay before handling the request.
	SlowRate float64
	// SlowDelay is how long a slow request waits.
	SlowDelay time.Duration
	// DropAfterChargeRate charges, then closes the connection without an
	// answer: the caller cannot know whether the card was charged.
	DropAfterChargeRate float64
}

// gatewayStats is what GET /stats returns.
type gatewayStats struct {
	// Requests counts POST /captures requests.
	Requests int64 `json:"requests"`
	// Charges counts cards charged.
	Charges int64 `json:"charges"`
	// DistinctCaptures counts the captureRequestIds charged at least once.
	DistinctCaptures int64 `json:"distinct_captures"`
	// DoubleCharges counts charges beyond the first for a captureRequestId,
	// whatever their keys: a key charged twice (the gateway failing to honour
	// it) or one capture request sent under two keys (a key derived from
	// something else than the captureRequestId). It must stay 0.
	DoubleCharges int64 `json:"double_charges"`
	// Replays counts requests answered with the stored result of their key.
	Replays int64 `json:"replays"`
	// KeyConflicts counts keys reused with another body (answered 409).
	KeyConflicts int64 `json:"key_conflicts"`
	// Failed, Slowed and Dropped count injected faults.
	Failed  int64 `json:"injected_failures"`
	Slowed  int64 `json:"slowed"`
	Dropped int64 `json:"dropped_after_charge"`
	// Webhooks counts the webhooks sent about the charges (all 0 without
	// -webhook-url).
	Webhooks webhookStats `json:"webhooks"`
}

// charge is the stored result of an idempotency key.
type charge struct {
	bodyHash [32]byte
	status   int
	response []byte
}

// chargeResponse is the body of a successful capture.
type chargeResponse struct {
	ChargeID         string `json:"chargeId"`
	CaptureRequestID string `json:"captureRequestId"`
	Amount           int64  `json:"amount"`
	Currency         string `json:"currency"`
	Status           string `json:"status"`
}

// gateway is a fake payment provider. It performs a capture at most once per
// Idempotency-Key: a request with a known key and the same body gets the
// stored answer (header Idempotent-Replayed: true); with another body, 409.
// It can inject failures, delays and answers lost after the charge.
type gateway struct {
	log *slog.Logger

	mu        sync.Mutex
	faults    faults
	byKey     map[string]*charge
	byCapture map[string]int64 // captureRequestId → times charged
	stats     gatewayStats

	hooks *webhookSender // nil: no webhooks; set once, under mu
}

func newGateway(f faults, log *slog.Logger) *gateway {
	return &gateway{log: log, faults: f, byKey: map[string]*charge{}, byCapture: map[string]int64{}}
}

// setFaults changes the injected faults from now on.
func (g *gateway) setFaults(f faults) {
	g.mu.Lock()
	g.faults = f
	g.mu.Unlock()
}

// sendWebhooks makes the gateway send a signed event per new charge to
// cfg.url; the caller runs the sender it returns.
func (g *gateway) sendWebhooks(cfg webhookConfig) *webhookSender {
	s := newWebhookSender(cfg, g.log)
	g.mu.Lock()
	g.hooks = s
	g.mu.Unlock()
	return s
}

// snapshot returns the counters.
func (g *gateway) snapshot() gatewayStats {
	g.mu.Lock()
	s, hooks := g.stats, g.hooks
	g.mu.Unlock()
	if hooks != nil {
		s.Webhooks = hooks.snapshot()
	}
	return s
}

// handler routes the gateway's endpoints.
func (g *gateway) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /captures", g.capture)
	mux.HandleFunc("GET /captures/{key}", g.lookup)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, g.snapshot())
	})
	return mux
}

// capture is POST /captures.
func (g *gateway) capture(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	g.mu.Lock()
	g.stats.Requests++
	f := g.faults
	g.mu.Unlock()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "read body: " + err.Error()})
		return
	}
	if key == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "Idempotency-Key header is required"})
		return
	}
	var c capture
	if err := json.Unmarshal(body, &c); err != nil || c.CaptureRequestID == "" || c.Amount <= 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body must be a capture with captureRequestId and a positive amount"})
		return
	}
	if roll(f.SlowRate) {
		g.mu.Lock()
		g.stats.Slowed++
		g.mu.Unlock()
		// A provider keeps working on a request whose caller gave up: the
		// wait ends early when the caller leaves, and the capture proceeds.
		t := time.NewTimer(f.SlowDelay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}

	hash := sha256.Sum256(body)
	g.mu.Lock()
	if prev, ok := g.byKey[key]; ok {
		if prev.bodyHash != hash {
			g.stats.KeyConflicts++
			g.mu.Unlock()
			writeJSON(w, http.StatusConflict, map[string]string{"error": "Idempotency-Key reused with a different request"})
			return
		}
		g.stats.Replays++
		g.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		writeRaw(w, prev.status, prev.response)
		return
	}
	if roll(f.FailRate) {
		g.stats.Failed++
		g.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "injected failure, nothing charged"})
		return
	}
	g.stats.Charges++
	g.byCapture[c.CaptureRequestID]++
	if n := g.byCapture[c.CaptureRequestID]; n == 1 {
		g.stats.DistinctCaptures++
	} else {
		g.stats.DoubleCharges++
		g.log.Error("double charge", "capture_request_id", c.CaptureRequestID, "times", n, "idempotency_key", key)
	}
	charged := chargeResponse{ChargeID: fmt.Sprintf("ch_%d", g.stats.Charges),
		CaptureRequestID: c.CaptureRequestID, Amount: c.Amount, Currency: c.Currency, Status: "captured"}
	resp, _ := json.Marshal(charged)
	g.byKey[key] = &charge{bodyHash: hash, status: http.StatusCreated, response: resp}
	drop := roll(f.DropAfterChargeRate)
	if drop {
		g.stats.Dropped++
	}
	hooks := g.hooks
	g.mu.Unlock()
	if hooks != nil {
		hooks.settled(charged)
	}

	if drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
		panic(http.ErrAbortHandler) // no hijacking (HTTP/2): abort the stream
	}
	writeRaw(w, http.StatusCreated, resp)
}

// lookup is GET /captures/{key}: the stored result of a key, or 404. It is
// how an operator checks an unknown capture effect.
func (g *gateway) lookup(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	c, ok := g.byKey[r.PathValue("key")]
	g.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no capture with this Idempotency-Key"})
		return
	}
	writeRaw(w, http.StatusOK, c.response)
}

func roll(p float64) bool { return p > 0 && rand.Float64() < p }

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// serveHTTP serves h on ln until ctx is cancelled, then shuts down, letting
// the requests in progress finish (for the API: their transactions commit or
// roll back either way; a client whose request did not finish retries with
// its key). Request contexts are detached from ctx, so that shutting down
// never cancels a commit halfway.
func serveHTTP(ctx context.Context, name string, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: serve: %w", name, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	if err != nil {
		err = errors.Join(fmt.Errorf("%s: shutdown: %w", name, err), srv.Close())
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// runGateway is the gateway subcommand.
func runGateway(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments gateway", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8099", "listen address")
	f := faultFlags(fs, faults{})
	hooks, secret := webhookFlags(fs, 0.3)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkWebhooks(hooks, *secret); err != nil {
		return err
	}
	log := newLogger(slog.LevelInfo)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g := newGateway(*f, log)
	fns := []func(context.Context) error{func(ctx context.Context) error { return serveHTTP(ctx, "gateway", ln, g.handler()) }}
	if hooks.url != "" {
		fns = append(fns, g.sendWebhooks(*hooks).run)
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "fail_rate", f.FailRate, "slow_rate", f.SlowRate,
		"slow_delay", f.SlowDelay, "drop_after_charge_rate", f.DropAfterChargeRate, "webhook_url", hooks.url)
	err = run.All(ctx, fns...)
	s := g.snapshot()
	log.Info("gateway stopped", "requests", s.Requests, "charges", s.Charges,
		"distinct_captures", s.DistinctCaptures, "double_charges", s.DoubleCharges,
		"webhook_events", s.Webhooks.Events, "webhook_deliveries", s.Webhooks.Deliveries, "webhooks_pending", s.Webhooks.pending())
	return err
}

// faultFlags registers the fault injection flags on fs, with defaults def.
func faultFlags(fs *flag.FlagSet, def faults) *faults {
	f := &faults{}
	fs.Float64Var(&f.FailRate, "fail-rate", def.FailRate, "fraction of capture requests answered 503 without charging")
	fs.Float64Var(&f.SlowRate, "slow-rate", def.SlowRate, "fraction of capture requests delayed by -slow-delay")
	fs.DurationVar(&f.SlowDelay, "slow-delay", cmp.Or(def.SlowDelay, 2*time.Second), "delay of a slow request")
	fs.Float64Var(&f.DropAfterChargeRate, "drop-after-charge-rate", def.DropAfterChargeRate,
		"fraction of new charges whose connection is closed without an answer (the ambiguous case)")
	return f
}
