package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/prommetrics"
	"github.com/idemkit/idem/run"
)

// workerConfig says what a worker consumes and where it sends captures.
type workerConfig struct {
	pool       *pgxpool.Pool
	tables     idem.Tables
	amqpURL    string
	queue      string
	partitions int
	gatewayURL string
	// client calls the gateway. Default: a client with a 10 second timeout.
	client *http.Client
	logger *slog.Logger
	// tuneConsumer and tuneDispatcher, when set, adjust the configurations
	// (tests and the demo shorten the delays).
	tuneConsumer   func(*consumer.Config)
	tuneDispatcher func(*ledger.DispatcherConfig)
}

// worker is the consumer that records captures and the dispatcher that
// carries them out, run together in one process.
type worker struct {
	consumer   *consumer.Consumer
	dispatcher *ledger.Dispatcher
}

func newWorker(cfg workerConfig) (*worker, error) {
	if cfg.gatewayURL == "" {
		return nil, errors.New("worker: a gateway URL is required")
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.client == nil {
		cfg.client = &http.Client{Timeout: 10 * time.Second}
	}
	h, err := newCaptureHandler(cfg.tables, cfg.gatewayURL, cfg.logger)
	if err != nil {
		return nil, err
	}
	nodes, err := amqpnodes.Split(cfg.amqpURL)
	if err != nil {
		return nil, err
	}
	ccfg := consumer.Config{
		AMQPURLs: nodes,
		Name:     consumerName,
		Pool:     cfg.pool,
		Queue:    cfg.queue,
		// With -partitions, the queue is an exchange in front of that many
		// partitions spread over the worker processes; a capture request's
		// messages (their routing key) stay in order across processes.
		Partitions: cfg.partitions,
		Tables:     cfg.tables,
		Logger:     cfg.logger,
	}
	if cfg.tuneConsumer != nil {
		cfg.tuneConsumer(&ccfg)
	}
	c, err := consumer.New(ccfg)
	if err != nil {
		return nil, err
	}
	c.Handle(h.handle)
	dcfg := ledger.DispatcherConfig{
		Pool:   cfg.pool,
		Tables: cfg.tables,
		Logger: cfg.logger,
		// The gateway performs a capture at most once per Idempotency-Key,
		// so a capture whose outcome is unknown (the answer was lost) is
		// sent again with the same key instead of waiting for an operator.
		Executors: map[string]ledger.Executor{
			effectCapture: &ledger.HTTPExecutor{Client: cfg.client, Deduplicates: true},
		},
	}
	if cfg.tuneDispatcher != nil {
		cfg.tuneDispatcher(&dcfg)
	}
	d, err := ledger.NewDispatcher(dcfg)
	if err != nil {
		return nil, err
	}
	return &worker{consumer: c, dispatcher: d}, nil
}

// run runs the consumer and the dispatcher until ctx is cancelled or one of
// them fails; either way both are stopped (the consumer drains its in-flight
// batches, the dispatcher its in-flight calls) before run returns.
func (w *worker) run(ctx context.Context) error {
	return run.All(ctx, w.consumer.Run, w.dispatcher.Run)
}

// runWorker is the worker subcommand.
func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments worker", flag.ContinueOnError)
	svc := serviceFlags(fs)
	queue := fs.String("queue", defaultQueue, "queue to consume")
	parts := fs.Int("partitions", 0, "consume the queue as that many partitions (consumer.Config.Partitions)")
	gatewayURL := fs.String("gateway-url", "http://127.0.0.1:8099", "base URL of the payment gateway")
	timeout := fs.Duration("gateway-timeout", 10*time.Second, "timeout of one gateway call")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	healthAddr := fs.String("health-addr", "", "serve GET /healthz and /readyz on this address (e.g. 127.0.0.1:8081)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger(slog.LevelInfo)
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
	w, err := newWorker(workerConfig{
		pool: pool, tables: tables, amqpURL: svc.amqpURL, queue: *queue, partitions: *parts,
		gatewayURL: *gatewayURL, client: &http.Client{Timeout: *timeout}, logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("worker started", "queue", *queue, "schema", svc.schema, "gateway", captureURL(*gatewayURL))
	if *healthAddr != "" {
		err = run.All(ctx, w.run, func(ctx context.Context) error {
			return health.ListenAndServe(ctx, *healthAddr, w.dispatcher, w.consumer)
		})
	} else {
		err = w.run(ctx)
	}
	s := w.consumer.Stats()
	log.Info("worker stopped", "processed", s.Processed, "duplicates", s.Duplicates, "dead_lettered", s.DeadLettered)
	return err
}
