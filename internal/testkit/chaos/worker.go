package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/ledger"
)

// Consumer names and the effect type of the chaos workers.
const (
	mainConsumer    = "chaos"
	orderedConsumer = "chaos_ordered"
	streamConsumer  = "chaos_stream"
	partConsumer    = "chaos_part"
	projTable       = "chaos_proj"
	chargeEffect    = "charge"
)

// maxMessageBytes is the workers' MaxMessageBytes: an oversized publish is
// larger.
const maxMessageBytes = 16 << 10

// deposit is a main-queue message's body. ID is read by
// consumer.IDFromJSONField, never here.
type deposit struct {
	Amount *int64 `json:"amount"`
	Charge string `json:"charge,omitempty"` // the gateway's behaviour; empty: no charge
}

// keyed is an ordered-queue message's body.
type keyed struct {
	Key  string `json:"key"`
	Seq  int    `json:"seq"`
	Fail bool   `json:"fail,omitempty"`
}

// workerFlags are what a worker process needs to know.
type workerFlags struct {
	schema, queue, orderedQueue string
	stream, streamURL           string
	partQueue                   string
	name                        string // the process, recorded with what it applies of the partitioned queue
	pgURL, amqpURL, gatewayURL  string
	healthAddr                  string
	// dispatcher makes the process the dispatcher alone: it consumes
	// nothing.
	dispatcher bool
}

// mainConfig is the main queue's consumer configuration, shared by the
// workers and the runner (which declares the queues with it).
func mainConfig(pool *pgxpool.Pool, f workerFlags) consumer.Config {
	cfg := consumer.Config{
		Name: mainConsumer, Queue: f.queue, Pool: pool, AMQPURL: f.amqpURL,
		Tables: idem.Tables{Schema: f.schema}, Workers: 2,
		MessageID: consumer.IDFromJSONField("id"), Hash: consumer.HashCanonicalJSON,
		MaxMessageBytes: maxMessageBytes, MaxAttempts: 4,
		RetryBaseDelay: 200 * time.Millisecond, RetryMaxDelay: time.Second,
		HandlerTimeout: 5 * time.Second, CommitTimeout: 5 * time.Second,
	}
	if nodes := splitList(f.amqpURL); len(nodes) > 1 { // cluster mode: the nodes, comma separated
		cfg.AMQPURL, cfg.AMQPURLs = "", nodes
	}
	return cfg
}

// orderedConfig is the ordered queue's: one key's messages in order.
func orderedConfig(pool *pgxpool.Pool, f workerFlags) consumer.Config {
	cfg := mainConfig(pool, f)
	cfg.Name, cfg.Queue = orderedConsumer, f.orderedQueue
	cfg.MessageID = consumer.IDFromJSONField("id")
	cfg.OrderingKey = func(m *consumer.Message) string {
		var k keyed
		_ = json.Unmarshal(m.Body, &k)
		return k.Key
	}
	cfg.MaxAttempts = 6
	return cfg
}

// partitionCount is how many partitions the partitioned queue has: with
// the two workers each holds 3, and a joiner takes 2, ceil(6 / 3).
const partitionCount = 6

// partConfig is the partitioned consumer's: keyed messages whose order
// must hold across the processes that share the partitions.
func partConfig(pool *pgxpool.Pool, f workerFlags) consumer.Config {
	cfg := orderedConfig(pool, f)
	cfg.Name, cfg.Queue, cfg.Partitions = partConsumer, f.partQueue, partitionCount
	return cfg
}

// streamConfig is the stream consumer's: deposits read from a stream,
// applied to the projection chaos_proj.
func streamConfig(pool *pgxpool.Pool, f workerFlags) consumer.Config {
	cfg := mainConfig(pool, f)
	cfg.Name, cfg.Queue, cfg.Stream, cfg.StreamURL = streamConsumer, "", f.stream, f.streamURL
	cfg.MaxMessageBytes = 0
	return cfg
}

// runWorker is `chaos worker`: one worker process, consuming the main
// queue (and the ordered one when given), dispatching the charges, and
// serving its readiness.
func runWorker(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f workerFlags
	fs.StringVar(&f.schema, "schema", "", "schema of idem's tables and the chaos tables")
	fs.StringVar(&f.queue, "queue", "", "the main queue")
	fs.StringVar(&f.orderedQueue, "ordered-queue", "", "the ordered queue (empty: not consumed here)")
	fs.StringVar(&f.pgURL, "pg-url", "", "PostgreSQL")
	fs.StringVar(&f.amqpURL, "amqp-url", "", "RabbitMQ")
	fs.StringVar(&f.gatewayURL, "gateway-url", "", "the fake gateway's charge URL")
	fs.StringVar(&f.healthAddr, "health", "", "address of /readyz (empty: none)")
	fs.StringVar(&f.stream, "stream", "", "the stream (empty: not consumed here)")
	fs.StringVar(&f.streamURL, "stream-url", "", "RabbitMQ's stream protocol")
	fs.BoolVar(&f.dispatcher, "dispatcher", false, "run the ledger dispatcher alone")
	fs.StringVar(&f.partQueue, "part-queue", "", "the partitioned queue (empty: not consumed here)")
	fs.StringVar(&f.name, "name", "", "the process's name")
	if err := fs.Parse(args); err != nil {
		return exitNotRun
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := work(ctx, f, logger); err != nil {
		fmt.Fprintln(stderr, "chaos worker:", err)
		return exitFail
	}
	return exitPass
}

func work(ctx context.Context, f workerFlags, logger *slog.Logger) error {
	pool, err := pgxpool.New(ctx, f.pgURL)
	if err != nil {
		return fmt.Errorf("chaos worker: connecting to PostgreSQL: %w", err)
	}
	defer pool.Close()
	tables := idem.Tables{Schema: f.schema}
	led, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	if err != nil {
		return err
	}
	if f.dispatcher {
		disp, err := ledger.NewDispatcher(ledger.DispatcherConfig{
			Pool: pool, Tables: tables, Logger: logger, Lease: 4 * time.Second,
			PollInterval: 200 * time.Millisecond, RetryBackoff: 200 * time.Millisecond, RetryBackoffMax: time.Second,
			Executors: map[string]ledger.Executor{chargeEffect: &ledger.HTTPExecutor{Client: &http.Client{Timeout: 3 * time.Second}}},
		})
		if err != nil {
			return err
		}
		return disp.Run(ctx)
	}
	var reporters []health.Reporter
	var runs []func(context.Context) error
	if f.queue != "" {
		cfg := mainConfig(pool, f)
		cfg.Logger = logger
		deposits, err := consumer.New(cfg)
		if err != nil {
			return err
		}
		deposits.Handle(applyDeposit(tables, led, f.gatewayURL))
		reporters = append(reporters, deposits)
		runs = append(runs, deposits.Run)
	}
	if f.partQueue != "" {
		pcfg := partConfig(pool, f)
		pcfg.Logger = logger
		part, err := consumer.New(pcfg)
		if err != nil {
			return err
		}
		part.Handle(applyKeyed(tables, "chaos_part", f.name))
		reporters = append(reporters, part)
		runs = append(runs, part.Run)
	}
	if f.stream != "" {
		proj, err := newProjection(f.schema)
		if err != nil {
			return err
		}
		scfg := streamConfig(pool, f)
		scfg.Logger = logger
		st, err := consumer.New(scfg)
		if err != nil {
			return err
		}
		st.Handle(applyStream(tables, led, proj, f.gatewayURL, nil))
		reporters = append(reporters, st)
		runs = append(runs, st.Run)
	}
	if f.orderedQueue != "" {
		ocfg := orderedConfig(pool, f)
		ocfg.Logger = logger
		ord, err := consumer.New(ocfg)
		if err != nil {
			return err
		}
		ord.Handle(applyKeyed(tables, "chaos_ordered", f.name))
		reporters = append(reporters, ord)
		runs = append(runs, ord.Run)
	}
	if f.healthAddr != "" {
		runs = append(runs, func(ctx context.Context) error { return health.ListenAndServe(ctx, f.healthAddr, reporters...) })
	}
	return runAll(ctx, runs)
}

// runAll runs every function until ctx ends or one fails, then stops the
// others and waits for them.
func runAll(ctx context.Context, runs []func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(runs))
	for i, run := range runs {
		wg.Add(1)
		go func() { // owned: ends with ctx, waited for below
			defer wg.Done()
			errs[i] = run(ctx)
			cancel()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// applyDeposit records the deposit in chaos_applied (no unique key: a
// message applied twice shows as two rows) and, when it asks for one, a
// charge through the ledger.
func applyDeposit(tables idem.Tables, led *ledger.Ledger, gatewayURL string) consumer.Handler {
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.chaos_applied (message_id, amount) VALUES ($1, $2)`
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var d deposit
		if err := json.Unmarshal(m.Body, &d); err != nil || d.Amount == nil {
			return consumer.DeadLetter("invalid_deposit", fmt.Errorf("chaos: deposit %q: %v", m.ID, err))
		}
		if _, err := tx.Exec(ctx, insert, m.ID, *d.Amount); err != nil {
			return err
		}
		if d.Charge == "" {
			return nil
		}
		req, _ := json.Marshal(map[string]any{"behave": d.Charge, "amount": *d.Amount, "message_id": m.ID})
		_, err := led.Record(ctx, tx, ledger.Effect{Type: chargeEffect, BusinessKey: m.ID, Target: gatewayURL,
			Request: json.RawMessage(req), Consumer: mainConsumer, MessageID: m.ID})
		if errors.Is(err, ledger.ErrEffectConflict) {
			// Another payload under an id a cleanup made the inbox forget,
			// whose charge the ledger still holds: refused, loudly.
			return consumer.DeadLetter(reasonEffectConflict, err)
		}
		return err
	}
}

// applyKeyed records a keyed message in table, with the name of the
// process; one asking for it fails its first attempt, so that it is
// retried while its key waits.
func applyKeyed(tables idem.Tables, table, by string) consumer.Handler {
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.` + table + ` (key, seq, by) VALUES ($1, $2, $3)`
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var k keyed
		if err := json.Unmarshal(m.Body, &k); err != nil || k.Key == "" {
			return consumer.DeadLetter("invalid_keyed", fmt.Errorf("chaos: keyed %q: %v", m.ID, err))
		}
		if k.Fail && m.Attempt == 1 {
			return fmt.Errorf("chaos: %s/%d fails its first attempt", k.Key, k.Seq)
		}
		_, err := tx.Exec(ctx, insert, k.Key, k.Seq, by)
		return err
	}
}

// chaosTables are the workers' own tables, beside idem's.
func chaosTables(schema string) string {
	return `CREATE TABLE ` + schema + `.chaos_applied (n bigserial PRIMARY KEY, message_id text NOT NULL, amount bigint NOT NULL);
CREATE TABLE ` + schema + `.chaos_ordered (n bigserial PRIMARY KEY, key text NOT NULL, seq int NOT NULL, by text NOT NULL);
CREATE TABLE ` + schema + `.chaos_part (n bigserial PRIMARY KEY, key text NOT NULL, seq int NOT NULL, by text NOT NULL);
CREATE TABLE ` + schema + `.chaos_http (n bigserial PRIMARY KEY, key text NOT NULL, amount bigint NOT NULL);
CREATE TABLE ` + schema + `.` + projTable + ` (message_id text PRIMARY KEY, amount bigint NOT NULL);
CREATE TABLE ` + schema + `.chaos_stream_log (n bigserial PRIMARY KEY, message_id text NOT NULL, mode text NOT NULL);`
}
