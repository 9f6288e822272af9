package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/partitions"
	"github.com/idemkit/idem/prommetrics"
	"github.com/idemkit/idem/run"
)

// The HTTP edge of the payments example: POST /captures takes a capture
// request with an Idempotency-Key, answers 202 with where to follow it
// (GET /captures/{captureRequestId}), and in the same transaction records
// the message for the worker in the ledger's outbox and the long-running
// operation the client polls. One key, one captureRequestId, one message,
// one charge.
const (
	// apiOperation scopes the keys of POST /captures.
	apiOperation = "captures.create"
	// effectCaptureRequested is the ledger effect that publishes a capture
	// request to the worker's queue. Its id, and so the AMQP message id, is
	// derived from this type and the captureRequestId.
	effectCaptureRequested = "publish.capture_requested"
	// apiName is stored as the effect's consumer, for operators.
	apiName = "payments-api"
	// tenantHeader and callerHeader name the tenant and the caller in this
	// example. See callerFromHeader.
	tenantHeader = "X-Tenant-ID"
	callerHeader = "X-Caller-ID"
)

// apiConfig says where the API keeps its records and where it publishes.
type apiConfig struct {
	pool    *pgxpool.Pool
	tables  idem.Tables
	amqpURL string
	queue   string
	// partitions are the worker's: capture requests go to the queue's
	// exchange keyed by captureRequestId.
	partitions int
	// wait, lease and expiry are httpinbox's Config.Wait, Lease and Expiry
	// (0: httpinbox's defaults, and no wait).
	wait, lease, expiry time.Duration
	// cleanupEvery is how often expired keys are deleted. Default: 1 minute.
	cleanupEvery time.Duration
	// webhookSecret checks the gateway's webhooks; empty leaves
	// POST /webhooks/gateway out.
	webhookSecret []byte
	logger        *slog.Logger
	// tuneDispatcher, when set, adjusts the outbox dispatcher's
	// configuration (tests and the demo shorten its delays).
	tuneDispatcher func(*ledger.DispatcherConfig)
}

// api is the HTTP handler, the outbox dispatcher that publishes what the
// handler recorded, and the cleanup of expired keys, run in one process.
type api struct {
	pool         *pgxpool.Pool
	keys         *httpinbox.Middleware
	ledger       *ledger.Ledger
	publisher    *ledger.AMQPExecutor
	dispatcher   *ledger.Dispatcher
	database     *health.Database // readiness of the database the requests need
	queue        string
	partitions   int
	cleanupEvery time.Duration
	insert       string // api_captures insert
	stored       string // api_captures row of a captureRequestId
	events       *eventReceiver
	secret       []byte // of the gateway's webhooks; nil: none received
	log          *slog.Logger
}

const insertAPICaptureSQL = `INSERT INTO %s
	(capture_request_id, tenant, caller, idempotency_key, order_id, amount, currency)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (capture_request_id) DO NOTHING`

const storedAPICaptureSQL = `SELECT order_id, amount, currency FROM %s WHERE capture_request_id = $1`

// apiCapturesTable is the quoted name of the api_captures table.
func apiCapturesTable(t idem.Tables) string {
	return pgx.Identifier{t.WithDefaults().Schema, "api_captures"}.Sanitize()
}

// tenantFromHeader and callerFromHeader are the tenant and the caller of a
// request: keys are scoped per (tenant, caller), so two callers never see
// each other's stored responses.
//
// THIS IS FOR THE EXAMPLE ONLY. A production API MUST take both from
// authentication (the verified token's tenant and subject, the API key's
// owner), never from headers the client sets freely: a client that can name
// another caller can replay that caller's stored responses by guessing its
// keys.
func tenantFromHeader(r *http.Request) string { return r.Header.Get(tenantHeader) }

// callerFromHeader: see tenantFromHeader.
func callerFromHeader(r *http.Request) string { return r.Header.Get(callerHeader) }

// newAPI returns the API for cfg; its tables exist (createTables).
func newAPI(cfg apiConfig) (*api, error) {
	if cfg.queue == "" {
		return nil, errors.New("api: a queue is required")
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.cleanupEvery <= 0 {
		cfg.cleanupEvery = time.Minute
	}
	keys, err := httpinbox.New(cfg.pool, httpinbox.Config{
		Caller: callerFromHeader,
		Tenant: tenantFromHeader,
		Expiry: cfg.expiry,
		Lease:  cfg.lease,
		Logger: cfg.logger,
		Tables: cfg.tables,
		Wait:   cfg.wait,
	})
	if err != nil {
		return nil, err
	}
	l, err := ledger.New(ledger.Config{Tables: cfg.tables})
	if err != nil {
		return nil, err
	}
	nodes, err := amqpnodes.Split(cfg.amqpURL)
	if err != nil {
		return nil, err
	}
	pub, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URLs: nodes, Logger: cfg.logger})
	if err != nil {
		return nil, err
	}
	dcfg := ledger.DispatcherConfig{
		Pool:      cfg.pool,
		Tables:    cfg.tables,
		Logger:    cfg.logger,
		Executors: map[string]ledger.Executor{effectCaptureRequested: pub},
	}
	if cfg.tuneDispatcher != nil {
		cfg.tuneDispatcher(&dcfg)
	}
	d, err := ledger.NewDispatcher(dcfg)
	if err != nil {
		return nil, err
	}
	captures := apiCapturesTable(cfg.tables)
	return &api{
		pool:         cfg.pool,
		keys:         keys,
		ledger:       l,
		publisher:    pub,
		dispatcher:   d,
		database:     health.NewDatabase(cfg.pool, "api database"),
		queue:        cfg.queue,
		partitions:   cfg.partitions,
		cleanupEvery: cfg.cleanupEvery,
		insert:       fmt.Sprintf(insertAPICaptureSQL, captures),
		stored:       fmt.Sprintf(storedAPICaptureSQL, captures),
		events:       newEventReceiver(cfg.tables),
		secret:       cfg.webhookSecret,
		log:          cfg.logger,
	}, nil
}

// handler routes POST /captures (idempotent), POST /captures:bulk (an
// operation key and a key per item), GET /captures/{id}, the status of a
// capture request as a long-running operation, and POST /webhooks/gateway
// when it has the webhooks' secret.
func (a *api) handler() http.Handler {
	mux := http.NewServeMux()
	if len(a.secret) > 0 {
		mux.Handle("POST /webhooks/gateway", a.events.route(a.keys, a.secret))
	}
	mux.Handle("POST /captures", a.keys.Handle(httpinbox.Route{Operation: apiOperation}, a.createCapture))
	mux.Handle("POST /captures:bulk", a.keys.Bulk(httpinbox.Bulk{Operation: bulkOperation, MaxItems: maxBulkItems}, a.captureItem))
	mux.Handle("GET /captures/{id}", a.keys.OperationStatus())
	return mux
}

// captureCreate is the body of POST /captures.
type captureCreate struct {
	OrderID  string `json:"orderId"`
	Amount   *int64 `json:"amount"`
	Currency string `json:"currency"`
}

// codeCaptureConflict answers a key that, after its record expired, came
// back for another capture than the one its captureRequestId names.
const codeCaptureConflict = "CAPTURE_REQUEST_CONFLICT"

// captureRequestID is the id of the capture request made with the key of
// claim: stable per (tenant, caller, operation, key), so a re-run after a
// crash, or a retry after the key's record expired, names the same capture.
func captureRequestID(claim *httpinbox.Claim) string { return "cr_" + claim.KeyID()[:24] }

// createCapture is the handler of POST /captures, in the middleware's
// transaction tx: validate, then accept the capture (acceptCapture). The
// key's record and response commit with all of it, or none of it exists.
func (a *api) createCapture(ctx context.Context, tx pgx.Tx, r *http.Request) (httpinbox.Response, error) {
	c, err := decodeCaptureCreate(r)
	if err != nil {
		return httpinbox.Response{}, httpinbox.Invalid(err)
	}
	return a.acceptCapture(ctx, tx, c)
}

// acceptCapture inserts the api_captures row of c, records the message for
// the worker in the outbox, and accepts the capture as an operation that
// follows the worker's capture effect: 202 with Location
// /captures/{captureRequestId}. The captureRequestId comes from the claim
// in ctx, the request's key (or a bulk item's).
func (a *api) acceptCapture(ctx context.Context, tx pgx.Tx, c capture) (httpinbox.Response, error) {
	claim := httpinbox.FromContext(ctx)
	id := captureRequestID(claim)
	c.CaptureRequestID = id
	tag, err := tx.Exec(ctx, a.insert, id, claim.Tenant(), claim.Caller(), claim.Key(), c.OrderID, c.Amount, c.Currency)
	if err != nil {
		return httpinbox.Response{}, fmt.Errorf("api: insert capture %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		// The key's record expired and the key came back: the capture
		// request exists. The same capture answers 202 again (the outbox
		// entry below is then a no-op); another one is refused.
		var stored capture
		if err := tx.QueryRow(ctx, a.stored, id).Scan(&stored.OrderID, &stored.Amount, &stored.Currency); err != nil {
			return httpinbox.Response{}, fmt.Errorf("api: read capture %s: %w", id, err)
		}
		stored.CaptureRequestID = id
		if stored != c {
			return httpinbox.Problem(http.StatusUnprocessableEntity, codeCaptureConflict,
				"this Idempotency-Key created capture request "+id+" for another order, amount or currency"), nil
		}
	}
	body, err := json.Marshal(captureRequested{
		SchemaVersion: ptr(schemaVersion), CaptureRequestID: id,
		OrderID: c.OrderID, Amount: ptr(c.Amount), Currency: c.Currency,
	})
	if err != nil {
		return httpinbox.Response{}, fmt.Errorf("api: encode capture request %s: %w", id, err)
	}
	exchange, routingKey := partitions.Route(a.queue, a.partitions, id)
	_, err = a.ledger.Record(ctx, tx, ledger.Effect{
		Type:        effectCaptureRequested,
		BusinessKey: id,
		Target:      "amqp queue " + a.queue,
		Request: ledger.Publishing{Exchange: exchange, RoutingKey: routingKey, ContentType: "application/json", Body: body,
			CorrelationID: id}, // the worker's envelope requires a correlation id
		Consumer:  apiName,
		MessageID: claim.KeyID(),
	})
	if err != nil {
		return httpinbox.Response{}, fmt.Errorf("api: record capture request %s: %w", id, err)
	}
	return a.keys.Accept(ctx, tx, httpinbox.Accepted{
		ID: id, Location: "/captures/" + id, Fields: c,
		// Done when the worker's capture is: running while it waits or is
		// retried, then succeeded (with the gateway's answer), failed or
		// unknown.
		Follows: ledger.EffectID(effectCapture, id),
	})
}

// decodeCaptureCreate reads and validates the body of POST /captures: one
// JSON object with exactly orderId, a positive integer amount (minor units)
// and a three-letter currency. The capture it returns has no id yet.
func decodeCaptureCreate(r *http.Request) (capture, error) {
	var c captureCreate
	if err := decodeOne(r.Body, &c); err != nil {
		return capture{}, err
	}
	return c.validate()
}

// decodeOne reads one JSON object with only v's members, and nothing after
// it, from rd into v.
func decodeOne(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body must be a JSON object with orderId, amount and currency: %w", err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return errors.New("body must hold one JSON object and nothing after it")
	}
	return nil
}

// validate checks the fields of a capture request.
func (c captureCreate) validate() (capture, error) {
	if err := checkText("orderId", c.OrderID); err != nil {
		return capture{}, err
	}
	switch {
	case c.Amount == nil:
		return capture{}, errors.New("amount is missing")
	case *c.Amount <= 0:
		return capture{}, fmt.Errorf("amount %d is not positive (amounts are in minor units)", *c.Amount)
	}
	if !isCurrency(c.Currency) {
		return capture{}, fmt.Errorf("currency %q is not an ISO 4217 code", c.Currency)
	}
	return capture{OrderID: c.OrderID, Amount: *c.Amount, Currency: c.Currency}, nil
}

// run serves the API on ln and runs its background work until ctx is
// cancelled or one of them fails; then the server drains its requests, the
// dispatcher its publishes, and run returns.
func (a *api) run(ctx context.Context, ln net.Listener) error {
	return run.All(ctx,
		func(ctx context.Context) error { return serveHTTP(ctx, "api", ln, a.handler()) },
		a.work)
}

// work runs the outbox dispatcher, the cleanup of expired keys and the
// database probe until ctx is cancelled, then closes the publisher's
// connection.
func (a *api) work(ctx context.Context) error {
	defer func() { _ = a.publisher.Close() }()
	return run.All(ctx, a.dispatcher.Run, a.cleanupLoop,
		func(ctx context.Context) error { a.database.Run(ctx); return nil })
}

// reporters are what GET /readyz and /healthz of -health-addr ask: the
// database every request writes to, and the dispatcher that publishes what
// they accepted. While the database is away, the API is live but not
// ready: a load balancer stops sending it commands it could only refuse.
func (a *api) reporters() []health.Reporter { return []health.Reporter{a.database, a.dispatcher} }

// cleanupLoop deletes expired keys every cleanupEvery until ctx is cancelled.
func (a *api) cleanupLoop(ctx context.Context) error {
	t := time.NewTicker(a.cleanupEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := a.keys.Cleanup(ctx, 0)
		switch {
		case err != nil && ctx.Err() == nil:
			a.log.Warn("api: delete expired idempotency keys", "error", err)
		case n > 0:
			a.log.Info("api: deleted expired idempotency keys", "deleted", n)
		}
	}
}

// runAPI is the api subcommand.
func runAPI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments api", flag.ContinueOnError)
	svc := serviceFlags(fs)
	addr := fs.String("addr", "127.0.0.1:8098", "listen address")
	queue := fs.String("queue", defaultQueue, "queue the capture requests are published to (the worker declares it)")
	parts := fs.Int("partitions", 0, "the worker's -partitions: capture requests go to the queue's exchange, keyed by captureRequestId")
	wait := fs.Duration("wait", 2*time.Second, "how long a request whose key is in progress waits for the first request's answer before 409")
	lease := fs.Duration("lease", httpinbox.DefaultLease, "how long a started request owns its key; a crashed request's key runs again after it")
	expiry := fs.Duration("expiry", httpinbox.DefaultExpiry, "how long a key is kept; must exceed the clients' retry horizon")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	healthAddr := fs.String("health-addr", "", "serve GET /healthz and /readyz on this address (e.g. 127.0.0.1:8082)")
	secret := webhookSecretFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger(slog.LevelInfo)
	webhooks := webhookSecret(*secret)
	if len(webhooks) == 0 {
		log.Warn("api: no -webhook-secret or " + webhookSecretEnv + ": POST /webhooks/gateway is not served")
	}
	metrics, err := prommetrics.Serve(*metricsAddr, log)
	if err != nil {
		return err
	}
	defer metrics.Close()
	metrics.SetGlobal() // the components below take the global provider
	pool, tables, err := svc.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := newAPI(apiConfig{
		pool: pool, tables: tables, amqpURL: svc.amqpURL, queue: *queue, partitions: *parts,
		wait: *wait, lease: *lease, expiry: *expiry, logger: log, webhookSecret: webhooks,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	log.Info("api listening", "addr", ln.Addr().String(), "queue", *queue, "schema", svc.schema)
	if *healthAddr != "" {
		err = run.All(ctx, func(ctx context.Context) error { return a.run(ctx, ln) }, func(ctx context.Context) error {
			return health.ListenAndServe(ctx, *healthAddr, a.reporters()...)
		})
	} else {
		err = a.run(ctx, ln)
	}
	log.Info("api stopped")
	return err
}
