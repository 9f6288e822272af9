package docs_test

// The guides' Go samples that are not part of a runnable example live here,
// line for line, inside code that compiles against the real API
// (TestGoSamplesInTheGuidesCompile finds them). The declarations around
// each sample stand for what the guide's reader already has.

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/pgnodes"
	"github.com/idemkit/idem/projection"
	"github.com/idemkit/idem/prommetrics"
	"github.com/idemkit/idem/replay"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/run"
)

// docs/handlers.md: scheduling keys.
func schedulingKeys(account func(*consumer.Message) string) consumer.Config {
	var cfg consumer.Config
	cfg.OrderingKey = func(m *consumer.Message) string { return account(m) }               // strict order per account
	cfg.BusinessKey = func(m *consumer.Message) (string, error) { return account(m), nil } // affinity, stored in the inbox
	return cfg
}

// docs/inbox.md: which id and which hash.
func identity(pool *pgxpool.Pool, amqpURL string) (*consumer.Consumer, error) {
	return consumer.New(consumer.Config{
		Name:      "billing",
		Queue:     "invoices",
		Pool:      pool,
		AMQPURL:   amqpURL,
		MessageID: consumer.IDFromJSONField("invoiceId"), // or IDFromHeader("x-request-id"), IDFromPayloadHash
		Hash:      consumer.HashCanonicalJSON,            // re-serialised JSON is the same payload
	})
}

// docs/ledger.md: a custom executor and reconciler.
type smsAPI interface {
	Send(ctx context.Context, to string, body []byte, idempotencyKey string) error
	Status(ctx context.Context, idempotencyKey string) (sent bool, err error)
}

var (
	errRejected = errors.New("sms: rejected")
	errNotSent  = errors.New("sms: not sent")
)

type smsGateway struct{ api smsAPI } // the provider's client

func (g *smsGateway) Execute(ctx context.Context, call ledger.Call) (ledger.Result, error) {
	err := g.api.Send(ctx, call.Target, call.Request, call.IdempotencyKey)
	switch {
	case err == nil:
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	case errors.Is(err, errRejected): // the provider refused the message for good
		return ledger.Result{Status: ledger.StatusFailedTerminal}, err
	case errors.Is(err, errNotSent): // refused before anything was sent
		return ledger.Result{Status: ledger.StatusFailedRetryable}, err
	default: // it may have been sent
		return ledger.Result{Status: ledger.StatusUnknown}, err
	}
}

func (g *smsGateway) DeduplicatesByKey() bool { return false }

func (g *smsGateway) Lookup(ctx context.Context, call ledger.Call) (ledger.Result, error) {
	sent, err := g.api.Status(ctx, call.IdempotencyKey)
	if err != nil {
		return ledger.Result{Status: ledger.StatusUnknown}, err // ask again later
	}
	if sent {
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}
	return ledger.Result{Status: ledger.StatusFailedRetryable}, nil // never arrived: send it again
}

var (
	_ ledger.Executor   = (*smsGateway)(nil)
	_ ledger.Reconciler = (*smsGateway)(nil)
)

// docs/http.md: the middleware in front of a payments endpoint.

type authContext struct{}

func (authContext) Tenant(ctx context.Context) string  { return "" }
func (authContext) Subject(ctx context.Context) string { return "" }

// auth stands for the application's authentication.
var auth authContext

type (
	CreatePayment struct{ Amount int64 }
	Payment       struct {
		ID     string
		Amount int64
	}
)

func paymentsEndpoint(pool *pgxpool.Pool, mux *http.ServeMux) error {
	m, err := httpinbox.New(pool, httpinbox.Config{
		// Whose key is it? Taken from authentication, never from the request body or a free header.
		Tenant: func(r *http.Request) string { return auth.Tenant(r.Context()) },
		Caller: func(r *http.Request) string { return auth.Subject(r.Context()) },
	})
	mux.Handle("POST /payments", m.Handle(httpinbox.Route{Operation: "payments.create"},
		func(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
			var req CreatePayment
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				return httpinbox.Response{}, httpinbox.Invalid(err) // 400, not stored: fix and retry with the same key
			}
			id := "pay_" + httpinbox.FromContext(ctx).KeyID()[:24] // identity from the key, stable across retries
			if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, req.Amount); err != nil {
				return httpinbox.Response{}, err // 500, rolled back, key released
			}
			// An outbox message or external call: record it in the same transaction.
			// ledger.Record(ctx, tx, ledger.Effect{Type: "payment.capture", BusinessKey: id, …})
			resp, err := httpinbox.JSON(http.StatusCreated, Payment{ID: id, Amount: req.Amount})
			resp.ResourceID = id
			return resp, err
		}))
	return err
}

func sharedScope(pool *pgxpool.Pool) (*httpinbox.Middleware, error) {
	m, err := httpinbox.New(pool, httpinbox.Config{SharedScope: true}) // every caller shares one key space
	return m, err
}

// docs/observability.md: serving Prometheus metrics from a worker.
func metricsServer(metricsAddr *string, logger *slog.Logger) error {
	metrics, err := prommetrics.Serve(*metricsAddr, logger) // "" leaves metrics off
	if err != nil {
		return err
	}
	defer metrics.Close()
	metrics.SetGlobal() // the components below take the global provider
	return nil
}

// docs/operations.md: retention in-process, and the health probes.
func cleanInProcess(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) {
	go func() {
		err := retention.Run(ctx, retention.Config{
			Pool:      pool,
			Tables:    tables,
			OlderThan: 30 * 24 * time.Hour,
			// Interval: time.Hour, Jitter: Interval/10, RoundTimeout: 15 * time.Minute (the defaults)
		})
		if err != nil {
			log.Fatal(err) // an invalid Config or an OlderThan below the floor; nothing was cleaned
		}
	}()
}

func probes(ctx context.Context, dispatcher *ledger.Dispatcher, consumer *consumer.Consumer) {
	go health.ListenAndServe(ctx, "0.0.0.0:8081", dispatcher, consumer)
	// or mount health.Handler(dispatcher, consumer) on a mux of your own
}

// The samples above are compiled, never run; naming them here keeps the
// compiler from calling them unused.
var _ = []any{schedulingKeys, identity, paymentsEndpoint, sharedScope, metricsServer, cleanInProcess, probes,
	consumerStreamsGodoc}

// docs/streams.md and the projection package: a stream consumer, a declared
// projection, an online rebuild and a version guard.
type orderEvent struct {
	OrderID string
	Version int
	Status  string
}

func streamsGuide(ctx context.Context, pool *pgxpool.Pool, url string, project consumer.Handler, tx pgx.Tx,
	id, status string, version int, upsert func(context.Context, pgx.Tx, orderEvent) error, ev orderEvent) error {
	c, err := consumer.New(consumer.Config{Name: "orders-overview", Stream: "orders.events", Pool: pool, AMQPURL: url})
	c.Handle(project)
	err = c.Run(ctx) // until ctx is cancelled

	overview, err := projection.New(projection.Config{
		Name:   "order_overview", // metrics, parked events, rebuild runs
		Schema: "orders",
		Tables: []string{"order_overview"}, // every table the handler writes
	})
	{
		overview, err := projection.New(projection.Config{
			Name:   "order_overview",
			Schema: "orders",
			Tables: []string{"order_overview"},
		})
		_, _ = overview, err
	}
	{
		_, err := tx.Exec(ctx, `INSERT INTO `+overview.Table(ctx, "order_overview")+` (order_id, status, version)
	VALUES ($1, $2, $3) ON CONFLICT (order_id) DO UPDATE SET …`, id, status, version)
		_ = err
	}
	sum, err := replay.Run(ctx, c, replay.Options{Mode: idem.Rebuild, Projection: overview, Progress: os.Stderr})
	_ = sum

	type event = orderEvent
	guard, err := projection.NewGuard(projection.GuardConfig[event]{
		Projection: overview, Table: "order_overview", KeyColumn: "order_id", VersionColumn: "version",
		Gaps:    projection.GapApply,
		Tables:  idem.Tables{Schema: "orders"}, // the consumer's Config.Tables
		Key:     func(ev event) string { return ev.OrderID },
		Version: func(ev event) int64 { return int64(ev.Version) },
		Apply:   upsert, // writes ev, including its version, with overview.Table(ctx, …)
	})

	// in the handler:
	decision, err := guard.Handle(ctx, tx, ev) // projection.Applied, Stale or Parked
	_ = decision
	return err
}

// consumer's godoc, Streams: a stream consumer.
func consumerStreamsGodoc(ctx context.Context, pool *pgxpool.Pool) {
	c, err := consumer.New(consumer.Config{
		Name:    "orders-projection",
		Stream:  "orders.events",
		Pool:    pool,
		AMQPURL: os.Getenv("IDEM_AMQP_URL"),
	})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Defer(ctx, tx, `INSERT INTO events (stream_offset, body) VALUES ($1, $2)`, m.Offset, string(m.Body))
	})
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}

// docs/handlers.md: running the parts together.
func runTogether(ctx context.Context, pool *pgxpool.Pool, amqpURL string, metricsAddr, healthAddr *string,
	logger *slog.Logger, handle consumer.Handler) error {
	metrics, err := prommetrics.Serve(*metricsAddr, logger) // "" leaves metrics off
	if err != nil {
		return err
	}
	defer metrics.Close()
	c, err := consumer.New(consumer.Config{Name: "billing", Queue: "deposits", Pool: pool, AMQPURL: amqpURL,
		MeterProvider: metrics.MeterProvider()})
	if err != nil {
		return err
	}
	c.Handle(handle)
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: pool,
		Executors:     map[string]ledger.Executor{"mail": &ledger.HTTPExecutor{}},
		MeterProvider: metrics.MeterProvider()})
	if err != nil {
		return err
	}
	return run.All(ctx,
		c.Run, // the consumer
		d.Run, // the effects its handlers record
		func(ctx context.Context) error { return health.ListenAndServe(ctx, *healthAddr, c, d) },
		func(ctx context.Context) error {
			return retention.Run(ctx, retention.Config{Pool: pool, OlderThan: 30 * 24 * time.Hour})
		},
	)
}

// docs/configuration.md: a configuration error, from any package.
func configurationError(err error) {
	if errors.Is(err, idem.ErrConfig) {
		log.Fatal(err) // retrying cannot help
	}
}

// docs/operations.md: a pool for a failover URL.
func failoverPool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := pgnodes.New(ctx, os.Getenv("IDEM_PG_URL"))
	return pool, err
}
