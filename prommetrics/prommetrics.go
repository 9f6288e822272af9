package prommetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem"
)

// Server serves the metrics until Close. Its methods are safe on the
// Server that Serve returns for an empty address, and do nothing there.
type Server struct {
	ln       net.Listener
	srv      *http.Server
	provider *sdkmetric.MeterProvider
	done     chan struct{} // closed when the serving goroutine returns
}

// Serve creates a MeterProvider that exports through the OpenTelemetry
// Prometheus exporter and serves GET /metrics on addr in the background
// until Close. The Go runtime and process collectors are served beside
// idem's metrics. It leaves OpenTelemetry's global provider alone: pass
// MeterProvider to each component's Config, or call SetGlobal.
//
// With addr "" it does nothing and returns a Server whose methods do
// nothing, so the default of a flag can leave metrics off. An addr that is
// not host:port is an error wrapping idem.ErrConfig.
func Serve(addr string, logger *slog.Logger) (*Server, error) {
	if addr == "" {
		return &Server{}, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("prommetrics: %w: %w", idem.ErrConfig, err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("prommetrics: register go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("prommetrics: register process collector: %w", err)
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, fmt.Errorf("prommetrics: exporter: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("prommetrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &Server{
		ln:       ln,
		srv:      &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		done:     make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			logger.Error("prommetrics: serve metrics", "addr", ln.Addr().String(), "error", err)
		}
	}()
	logger.Info("serving Prometheus metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return s, nil
}

// MeterProvider returns the provider whose instruments Serve exports; nil
// when metrics are off, so that a component's Config given it falls back to
// the global provider.
func (s *Server) MeterProvider() metric.MeterProvider {
	if s.provider == nil {
		return nil
	}
	return s.provider
}

// SetGlobal makes the served provider OpenTelemetry's global one
// (otel.SetMeterProvider), so that every component created afterwards with
// its default MeterProvider reports to it. It does nothing when metrics are
// off.
func (s *Server) SetGlobal() {
	if s.provider != nil {
		otel.SetMeterProvider(s.provider)
	}
}

// Addr returns the address the metrics are served on, "" when off.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close stops serving, waiting at most 5 seconds for scrapes in progress,
// and shuts the MeterProvider down.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return errors.Join(err, s.provider.Shutdown(ctx))
}
