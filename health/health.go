package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/idemkit/idem"
)

// Status is what a component says about itself.
type Status struct {
	// Component names the component, e.g. "consumer billing" or "ledger
	// dispatcher".
	Component string
	// Ready reports whether it can do its work now: connected and working
	// (a consumer connected and consuming, a dispatcher with its database).
	// A component that is not ready should get no traffic, but it is not
	// restarted for that.
	Ready bool
	// Live reports whether it makes progress: its loops turn, nothing is
	// wedged. A component that is not live should be restarted.
	Live bool
	// Reason says briefly why it is not ready or not live; "" when it is
	// both.
	Reason string
}

// Reporter is a component that reports its health. *ledger.Dispatcher and
// *consumer.Consumer implement it. Health must be cheap and must not block:
// it reads what the component's own loops last observed.
type Reporter interface {
	Health() Status
}

// ReporterFunc adapts a function to Reporter, for checks of your own.
type ReporterFunc func() Status

// Health returns f().
func (f ReporterFunc) Health() Status { return f() }

// Paths Handler serves.
const (
	// LivenessPath answers 200 while every reporter is live.
	LivenessPath = "/healthz"
	// ReadinessPath answers 200 while every reporter is ready.
	ReadinessPath = "/readyz"
)

// report is the JSON body Handler writes.
type report struct {
	OK     bool    `json:"ok"`
	Checks []check `json:"checks"`
}

type check struct {
	Component string `json:"component"`
	Ready     bool   `json:"ready"`
	Live      bool   `json:"live"`
	Reason    string `json:"reason,omitempty"`
}

// Handler serves GET (and HEAD) LivenessPath and ReadinessPath for
// reporters: 200 when all of them are live (respectively ready), 503
// otherwise, with a small JSON body listing each component:
//
//	{"ok":false,"checks":[{"component":"ledger dispatcher","ready":false,"live":true,"reason":"database: connection refused"}]}
//
// Other paths answer 404, other methods 405. With no reporters both paths
// answer 200.
func Handler(reporters ...Reporter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ready bool
		switch r.URL.Path {
		case LivenessPath:
		case ReadinessPath:
			ready = true
		default:
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		rep := report{OK: true, Checks: make([]check, 0, len(reporters))}
		for _, rp := range reporters {
			s := rp.Health()
			rep.Checks = append(rep.Checks, check{Component: s.Component, Ready: s.Ready, Live: s.Live, Reason: s.Reason})
			if ready && !s.Ready || !ready && !s.Live {
				rep.OK = false
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !rep.OK {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(rep)
		}
	})
}

// ListenAndServe serves Handler(reporters...) on addr (host:port) until ctx
// ends, then shuts the server down (waiting at most 5 seconds for requests
// in flight) and returns nil. It returns an error when it cannot listen,
// wrapping idem.ErrConfig when addr is not host:port.
func ListenAndServe(ctx context.Context, addr string, reporters ...Reporter) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("health: %w: %w", idem.ErrConfig, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: Handler(reporters...), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("health: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health: serve on %s: %w", addr, err)
	}
	return nil
}
