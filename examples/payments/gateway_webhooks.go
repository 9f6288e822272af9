package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// The fake gateway tells the merchant about each capture it performs with a
// signed webhook, as payment providers do: at least once, often twice (a
// duplicate sent at the same moment, or again after an answer it did not
// see), retried with backoff until it gets a 2xx.
const (
	// webhookQueue bounds the events waiting to be sent. An event's body
	// holds the capture's fields, each at most maxField bytes, so it stays
	// under 1 KiB and the queue under 4 MiB.
	webhookQueue = 4096
	// webhookWorkers send events at once.
	webhookWorkers = 4
	// webhookAttempts bounds the deliveries of one event before the gateway
	// gives up on it (about a minute of backoff).
	webhookAttempts = 30
	// webhookEnqueueWait bounds how long a capture waits for room in the
	// queue; past it the event is dropped, and counted.
	webhookEnqueueWait = 5 * time.Second
	// webhookTimeout bounds one delivery.
	webhookTimeout = 10 * time.Second
)

// webhookConfig says where the gateway sends its events.
type webhookConfig struct {
	// url is the receiver, e.g. http://127.0.0.1:8098/webhooks/gateway.
	url string
	// secret signs the events.
	secret []byte
	// dupRate is the fraction of events delivered twice at once, and the
	// fraction delivered again after a 2xx.
	dupRate float64
}

// webhookStats count what the sender did: "webhooks" in GET /stats.
type webhookStats struct {
	// Events counts events emitted, one per new charge.
	Events int64 `json:"events"`
	// Deliveries counts POSTs sent, duplicates and retries included.
	Deliveries int64 `json:"deliveries"`
	// Duplicates counts deliveries made on purpose beyond the first.
	Duplicates int64 `json:"duplicates"`
	// Retries counts deliveries after one that failed.
	Retries int64 `json:"retries"`
	// Delivered counts events answered 2xx at least once.
	Delivered int64 `json:"delivered"`
	// Failed counts events given up on; Dropped those the full queue
	// refused. Both must stay 0.
	Failed  int64 `json:"failed"`
	Dropped int64 `json:"dropped"`
}

// pending is the number of events not delivered, given up or dropped yet.
func (s webhookStats) pending() int64 { return s.Events - s.Delivered - s.Failed - s.Dropped }

// webhookEvent is one event to deliver.
type webhookEvent struct {
	id   string
	body []byte
}

// webhookSender delivers the gateway's events. Its run owns the workers.
type webhookSender struct {
	cfg    webhookConfig
	signer *httpinbox.TimestampedHMAC
	client *http.Client
	queue  chan webhookEvent
	log    *slog.Logger

	mu    sync.Mutex
	stats webhookStats
}

func newWebhookSender(cfg webhookConfig, log *slog.Logger) *webhookSender {
	return &webhookSender{cfg: cfg, signer: gatewaySigner(cfg.secret), log: log,
		client: &http.Client{Timeout: webhookTimeout}, queue: make(chan webhookEvent, webhookQueue)}
}

// count changes the counters under the lock.
func (s *webhookSender) count(f func(*webhookStats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *webhookSender) snapshot() webhookStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// settled emits the capture.settled event of charge, or drops it when the
// queue stays full.
func (s *webhookSender) settled(charge chargeResponse) {
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	ev := webhookEvent{id: "evt_" + hex.EncodeToString(id[:])}
	ev.body, _ = json.Marshal(map[string]any{"id": ev.id, "type": "capture.settled", "data": charge}) // strings and ints
	s.count(func(st *webhookStats) { st.Events++ })
	t := time.NewTimer(webhookEnqueueWait)
	defer t.Stop()
	select {
	case s.queue <- ev:
	case <-t.C:
		s.count(func(st *webhookStats) { st.Dropped++ })
		s.log.Error("gateway: webhook queue full; event dropped", "event_id", ev.id)
	}
}

// run delivers queued events with webhookWorkers workers until ctx is
// cancelled; an event in flight then stays undelivered.
func (s *webhookSender) run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range webhookWorkers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-s.queue:
					s.deliver(ctx, ev)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// deliver sends ev until it is answered 2xx, with backoff; some events twice
// at once, and some again after their 2xx.
func (s *webhookSender) deliver(ctx context.Context, ev webhookEvent) {
	pause := 20 * time.Millisecond
	for attempt := 1; attempt <= webhookAttempts; attempt++ {
		if attempt > 1 {
			s.count(func(st *webhookStats) { st.Retries++ })
			if !sleep(ctx, pause) {
				return
			}
			pause = min(2*pause, 2*time.Second)
		}
		var ok, final bool
		if attempt == 1 && roll(s.cfg.dupRate) {
			ok, final = s.twice(ctx, ev)
		} else {
			ok, final = s.post(ctx, ev)
		}
		if ok {
			s.count(func(st *webhookStats) { st.Delivered++ })
			if roll(s.cfg.dupRate) { // the gateway did not see the answer
				s.count(func(st *webhookStats) { st.Duplicates++ })
				s.post(ctx, ev)
			}
			return
		}
		if final {
			break
		}
	}
	s.count(func(st *webhookStats) { st.Failed++ })
	s.log.Error("gateway: gave up on a webhook", "event_id", ev.id)
}

// twice sends ev twice at once: ok when either was answered 2xx, final when
// both were refused for good.
func (s *webhookSender) twice(ctx context.Context, ev webhookEvent) (ok, final bool) {
	s.count(func(st *webhookStats) { st.Duplicates++ })
	var (
		wg     sync.WaitGroup
		okB    bool
		finalB bool
	)
	wg.Go(func() { okB, finalB = s.post(ctx, ev) })
	okA, finalA := s.post(ctx, ev)
	wg.Wait()
	return okA || okB, finalA && finalB
}

// post delivers ev once, freshly signed: ok on a 2xx, final when the
// receiver refused it for good (a 4xx other than 409 and 429).
func (s *webhookSender) post(ctx context.Context, ev webhookEvent) (ok, final bool) {
	s.count(func(st *webhookStats) { st.Deliveries++ })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.url, bytes.NewReader(ev.body))
	if err != nil {
		return false, true
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signatureHeader, s.signer.Sign(ev.body, time.Now()))
	resp, err := s.client.Do(req)
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return true, false
	case c >= 400 && c < 500 && c != http.StatusConflict && c != http.StatusTooManyRequests:
		s.log.Error("gateway: webhook refused", "event_id", ev.id, "status", c)
		return false, true
	}
	return false, false
}

// sleep waits d unless ctx ends first; false when it did.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// webhookFlags registers the gateway's webhook flags on fs; the second
// result is -webhook-secret (see checkWebhooks).
func webhookFlags(fs *flag.FlagSet, dupRate float64) (*webhookConfig, *string) {
	cfg := &webhookConfig{}
	fs.StringVar(&cfg.url, "webhook-url", "", "send a signed capture.settled webhook per charge to this URL (default: none)")
	fs.Float64Var(&cfg.dupRate, "webhook-dup-rate", dupRate, "fraction of webhooks delivered twice at once, and again after their answer")
	return cfg, webhookSecretFlag(fs)
}

// checkWebhooks completes cfg with the secret and refuses webhooks without
// one.
func checkWebhooks(cfg *webhookConfig, secretFlag string) error {
	cfg.secret = webhookSecret(secretFlag)
	if cfg.url != "" && len(cfg.secret) == 0 {
		return fmt.Errorf("gateway: -webhook-url needs -webhook-secret or $%s", webhookSecretEnv)
	}
	return nil
}
