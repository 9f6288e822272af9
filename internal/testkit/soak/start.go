package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

// startAll starts the gateway, the mail stub and the workers, and waits
// until the workers have set up their schemas and queues.
func (h *harness) startAll(ctx context.Context) error {
	if h.cfg.runs(orders) {
		env, err := streamio.Open(ctx, streamio.Config{URI: h.cfg.streamURL, Logger: h.quiet})
		if err != nil {
			return err
		}
		err = env.DeclareStream(ctx, h.stream, streamio.StreamOptions{})
		env.Close()
		if err != nil {
			return err
		}
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		h.mailURL = "http://" + addr
		h.mail = &proc{name: "mailstub", path: h.bins[orders], args: []string{"mailstub", "-addr", addr}, logDir: h.logDir}
		if err := h.sup.start(h.mail); err != nil {
			return err
		}
	}
	if h.cfg.runs(payments) {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		h.gatewayURL = "http://" + addr
		h.gateway = &proc{name: "gateway", path: h.bins[payments], args: append([]string{"gateway", "-addr", addr}, h.gatewayFaults()...), logDir: h.logDir}
		if err := h.sup.start(h.gateway); err != nil {
			return err
		}
	}
	for _, ex := range h.cfg.examples {
		pgURL, err := withAppName(h.cfg.pgURL, h.appName(ex))
		if err != nil {
			return err
		}
		p := &proc{name: ex.String(), path: h.bins[ex], restart: true, logDir: h.logDir, env: h.env(pgURL)}
		switch ex {
		case liveness:
			p = h.livenessProc(ex.String(), pgURL)
		case quickstart:
			p.args = []string{"worker", "-queue", h.queue(ex), "-schema", h.schema(ex)}
		case payments:
			p.args = []string{"worker", "-queue", h.queue(ex), "-schema", h.schema(ex),
				"-gateway-url", h.gatewayURL, "-gateway-timeout", "1s"}
		case orders:
			p.args = h.ordersArgs("worker")
		}
		h.workers[ex] = p
		if err := h.sup.start(p); err != nil {
			return err
		}
	}
	return h.waitReady(ctx)
}

// livenessProc is a process of the liveness worker (`soak worker`) tagged
// tag; every process of it has the same consumer Name, queue and schema.
func (h *harness) livenessProc(tag, pgURL string) *proc {
	return &proc{name: tag, path: h.bins[liveness], restart: true, poison: true, logDir: h.logDir, env: h.env(pgURL),
		args: []string{"worker", "-queue", h.queue(liveness), "-schema", h.schema(liveness), "-tag", tag}}
}

// env is the environment the run gives the processes it starts: where
// PostgreSQL is (pgURL, with the process's application_name) and every
// node of the broker, in the variables the examples, the idem command and
// the liveness worker read.
func (h *harness) env(pgURL string) []string {
	return []string{"IDEM_PG_URL=" + pgURL, "IDEM_AMQP_URL=" + strings.Join(h.cfg.amqpURLs, ","), "IDEM_STREAM_URL=" + h.cfg.streamURL}
}

// gatewayFaults are the gateway's fault flags: with the gateway fault, 5%
// of new captures fail with 503, 5% stall past the worker's 1s timeout (and
// are charged anyway) and 3% are charged and then dropped without an answer.
// The dispatcher fault alone needs the stalls, for calls to be in flight.
func (h *harness) gatewayFaults() []string {
	switch {
	case h.cfg.has(faultGateway):
		return []string{"-fail-rate", "0.05", "-slow-rate", "0.05", "-slow-delay", "2s", "-drop-after-charge-rate", "0.03"}
	case h.cfg.has(faultDispatcher):
		return []string{"-slow-rate", "0.05", "-slow-delay", "2s"}
	}
	return nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitReady waits until every worker has declared its queue (queue
// examples) or created its tables (orders), at most a minute.
func (h *harness) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for _, ex := range h.cfg.examples {
		for {
			ok, err := h.ready(ctx, ex)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the %s worker is not ready after a minute (%v); its log:\n%s", ex, err, h.workers[ex].tail(20))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func (h *harness) ready(ctx context.Context, ex example) (bool, error) {
	if ex == orders {
		var ok bool
		err := h.db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
			h.db.t(orders, "checkpoints"), h.db.table(orders, "order_overview")).Scan(&ok)
		return ok, err
	}
	_, err := queueDepth(ctx, h.cfg.amqpURLs, h.queue(ex)+".dlq")
	return err == nil, err
}
