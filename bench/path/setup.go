package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/migrate"
)

// shutdownTimeout bounds the consumer's shutdown at the end of the run.
const shutdownTimeout = 10 * time.Second

// The sources whose path bench/path measures.
const (
	sourceQueue  = "queue"
	sourceStream = "stream"
)

// rig is what the measurement of one source runs on: a fresh schema, a
// fresh quorum queue or stream, a running consumer and a publisher, and
// what cleanup removes.
type rig struct {
	o       options
	source  string // sourceQueue or sourceStream
	runID   string
	pool    *pgxpool.Pool
	tables  idem.Tables
	queue   string // the queue or the stream
	pub     *amqp.Connection
	ch      *amqp.Channel // the publisher's channel, in confirm mode
	c       *consumer.Consumer
	stopRun func() error // cancels Run and waits for it; nil until Run starts
}

// setup creates the schema (idem's tables and the handler's effects table),
// connects the publisher, and starts a consumer of a fresh quorum queue or
// stream (source). On an error it removes what it created.
func setup(ctx context.Context, o options, source string) (r *rig, err error) {
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("run id: %w", err)
	}
	r = &rig{o: o, source: source, runID: hex.EncodeToString(id[:])}
	r.tables = idem.Tables{Schema: "bench_path_" + r.runID}.WithDefaults()
	r.queue = "bench.path." + source + "." + r.runID
	defer func() {
		if err != nil {
			r.cleanup()
		}
	}()
	if err := r.createSchema(ctx); err != nil {
		return nil, err
	}
	if err := r.connectPublisher(); err != nil {
		return nil, err
	}
	if source == sourceStream {
		err = r.startStreamConsumer(ctx)
	} else {
		err = r.startConsumer(ctx)
	}
	if err != nil {
		return nil, err
	}
	logf("run %s: schema %s, %s %s", r.runID, r.tables.Schema, source, r.queue)
	return r, nil
}

// createSchema opens the pool, migrates the run's schema and creates the
// table the handler writes to.
func (r *rig) createSchema(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(r.o.pgURL)
	if err != nil {
		return fmt.Errorf("postgres url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-bench-path-" + r.runID
	if r.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.pool.Ping(pingCtx); err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	if _, err := migrate.Up(ctx, r.pool, r.tables); err != nil {
		return fmt.Errorf("migrate %s: %w", r.tables.Schema, err)
	}
	ddl := `CREATE TABLE ` + r.effects() + ` (message_id text PRIMARY KEY)`
	if _, err := r.pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create effects table: %w", err)
	}
	return nil
}

// effects is the quoted name of the table the handler inserts into.
func (r *rig) effects() string { return pgx.Identifier{r.tables.Schema, "effects"}.Sanitize() }

// connectPublisher opens the publishing connection and a channel in
// confirm mode.
func (r *rig) connectPublisher() error {
	var err error
	if r.pub, err = dial(r.o.amqpURL, "bench-path-publisher"); err != nil {
		return err
	}
	if r.ch, err = r.pub.Channel(); err != nil {
		return fmt.Errorf("publisher channel: %w", err)
	}
	if err := r.ch.Confirm(false); err != nil {
		return fmt.Errorf("publisher confirms: %w", err)
	}
	return nil
}

// newConsumer creates the consumer, of the queue unless stream: its handler
// makes one insert, as a real handler writes.
func (r *rig) newConsumer(stream bool) (*consumer.Consumer, error) {
	cfg := consumer.Config{
		AMQPURL:         r.o.amqpURL,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Name:            "bench-path",
		Pool:            r.pool,
		ShutdownTimeout: shutdownTimeout,
		Tables:          r.tables,
	}
	if stream {
		// Declared by startStreamConsumer through AMQP 0-9-1 already.
		cfg.Stream, cfg.Topology = r.queue, consumer.Existing
	} else {
		cfg.Queue = r.queue
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	insert := `INSERT INTO ` + r.effects() + ` (message_id) VALUES ($1)`
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, insert, m.ID)
		return err
	})
	return c, nil
}

// startConsumer creates the queue's consumer, declares its queues and
// starts Run.
func (r *rig) startConsumer(ctx context.Context) error {
	c, err := r.newConsumer(false)
	if err != nil {
		return err
	}
	declareCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Declare(declareCtx); err != nil {
		return fmt.Errorf("declare %s: %w", r.queue, err)
	}
	r.c = c
	r.start(c.Run)
	return nil
}

// startStreamConsumer declares the stream (through AMQP 0-9-1, which the
// publisher uses too, so that no call of the module's stream client runs
// on the measuring goroutine), creates its consumer and starts Run.
func (r *rig) startStreamConsumer(ctx context.Context) error {
	_, err := r.ch.QueueDeclare(r.queue, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
	if err != nil {
		return fmt.Errorf("declare stream %s: %w", r.queue, err)
	}
	c, err := r.newConsumer(true)
	if err != nil {
		return err
	}
	r.c = c
	r.start(c.Run)
	return nil
}

// start runs the consumer's run on a goroutine of its own; stopRun stops it.
func (r *rig) start(run func(context.Context) error) {
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(runCtx) }()
	r.stopRun = func() error {
		stop()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("consumer run: %w", err)
			}
			return nil
		case <-time.After(shutdownTimeout + 5*time.Second):
			return fmt.Errorf("consumer run: not returned %s after its cancellation", shutdownTimeout+5*time.Second)
		}
	}
}

// publish sends one persistent message with id to the queue and waits for
// the broker's confirm.
func (r *rig) publish(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := r.ch.PublishWithDeferredConfirmWithContext(ctx, "", r.queue, false, false, amqp.Publishing{
		MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Body: []byte(fmt.Sprintf(`{"id":%q}`, id)),
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", id, err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("publish %s: confirmed=%v: %v", id, ok, err)
	}
	return nil
}

// cleanup stops the consumer, deletes the queues it declared and drops the
// schema. It removes what exists of a rig that setup left half-built.
func (r *rig) cleanup() {
	if r.stopRun != nil {
		if err := r.stopRun(); err != nil {
			logf("cleanup: %v", err)
		}
	}
	if r.pub != nil {
		if err := r.deleteQueues(); err != nil {
			logf("cleanup: %v", err)
		}
		_ = r.pub.Close()
	}
	if r.pool != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := r.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+r.tables.QuotedSchema()+` CASCADE`); err != nil {
			logf("cleanup: drop schema %s: %v", r.tables.Schema, err)
		}
		r.pool.Close()
	}
}

// deleteQueues deletes the stream, or the queue and the retry and
// dead-letter queues the consumer declares for it, each on a channel of its
// own (a failed delete closes its channel).
func (r *rig) deleteQueues() error {
	var errs []error
	queues := amqpnames.Queues(r.queue, 0)
	if r.source == sourceStream {
		queues = []string{r.queue}
	}
	for _, q := range queues {
		ch, err := r.pub.Channel()
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("delete queue %s: %w", q, err))...)
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
		}
		_ = ch.Close()
	}
	return errors.Join(errs...)
}

// dial connects to RabbitMQ with a connection name shown in its management UI.
func dial(url, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	return conn, nil
}
