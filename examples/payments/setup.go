package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/pgnodes"
)

// Defaults shared by the subcommands.
const (
	// defaultQueue is the queue capture requests arrive on.
	defaultQueue = "payments.capture.requested"
	// defaultSchema holds idem's tables and the payments table.
	defaultSchema = "payments"
	// consumerName scopes the inbox and is stored with every effect.
	consumerName = "payments"
)

// services says where PostgreSQL and RabbitMQ are (IDEM_PG_URL;
// -amqp-url, else IDEM_AMQP_URL) and which schema holds the tables
// (-schema).
type services struct {
	pgURL, schema string
	// amqpURL is the broker: one URL, or a cluster's node URLs separated
	// by commas.
	amqpURL string
}

// serviceFlags registers -schema and -amqp-url on fs and reads the URLs'
// defaults from the environment.
func serviceFlags(fs *flag.FlagSet) *services {
	s := &services{pgURL: envOr("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable")}
	fs.StringVar(&s.schema, "schema", defaultSchema, "PostgreSQL schema for idem's tables and the payments table")
	amqpURLFlag(fs, &s.amqpURL)
	return s
}

// amqpURLFlag registers -amqp-url on fs, defaulting to IDEM_AMQP_URL.
func amqpURLFlag(fs *flag.FlagSet, p *string) {
	*p = envOr("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	fs.Var(secretURL{p}, "amqp-url",
		"RabbitMQ `URL`, or a cluster's node URLs separated by commas ($IDEM_AMQP_URL sets the default)")
}

// dialBroker connects to the first node of list (see services.amqpURL)
// that answers.
func dialBroker(ctx context.Context, list string) (*amqp.Connection, error) {
	urls, err := amqpnodes.Split(list)
	if err != nil {
		return nil, err
	}
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	return conn, nil
}

// open connects to PostgreSQL, applies idem's migrations to the schema and
// creates the example's tables. The caller closes the pool. The api and the
// worker may run it at the same moment on a fresh schema.
func (s *services) open(ctx context.Context) (*pgxpool.Pool, idem.Tables, error) {
	// pgnodes: a host that stops answering costs seconds (a connect
	// timeout per host of a multi-host URL, TCP keepalives).
	pool, err := pgnodes.New(ctx, s.pgURL)
	if err != nil {
		return nil, idem.Tables{}, fmt.Errorf("connect to postgres: %w", err)
	}
	tables := idem.Tables{Schema: s.schema}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		pool.Close()
		return nil, tables, fmt.Errorf("migrate %s: %w", s.schema, err)
	}
	if err := createTables(ctx, pool, tables); err != nil {
		pool.Close()
		return nil, tables, err
	}
	return pool, tables, nil
}

// createPaymentsSQL is the business table: one row per capture request. The
// primary key on capture_request_id is what turns a producer's retry (a new
// message id for the same capture) into a business duplicate.
const createPaymentsSQL = `CREATE TABLE IF NOT EXISTS %s (
	capture_request_id text        PRIMARY KEY,
	order_id           text        NOT NULL,
	amount             bigint      NOT NULL CHECK (amount > 0),
	currency           text        NOT NULL,
	message_id         text        NOT NULL,
	correlation_id     text        NOT NULL,
	created_at         timestamptz NOT NULL DEFAULT now()
)`

// createAPICapturesSQL is the API's business table: one row per accepted
// capture request, written in the same transaction as the key's record and
// the outbox entry.
const createAPICapturesSQL = `CREATE TABLE IF NOT EXISTS %s (
	capture_request_id text        PRIMARY KEY,
	tenant             text        NOT NULL,
	caller             text        NOT NULL,
	idempotency_key    text        NOT NULL,
	order_id           text        NOT NULL,
	amount             bigint      NOT NULL CHECK (amount > 0),
	currency           text        NOT NULL,
	created_at         timestamptz NOT NULL DEFAULT now()
)`

// createTables creates the example's tables (payments, api_captures,
// gateway_events) in tables' schema, in one
// transaction under the schema's advisory lock (the one migrate.Up takes):
// two processes running CREATE TABLE IF NOT EXISTS at once would otherwise
// race, and one would fail on pg_type's unique index.
func createTables(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrate.LockKey(tables.WithDefaults().Schema)); err != nil {
			return err
		}
		for _, ddl := range []string{
			fmt.Sprintf(createPaymentsSQL, paymentsTable(tables)),
			fmt.Sprintf(createAPICapturesSQL, apiCapturesTable(tables)),
			fmt.Sprintf(createGatewayEventsSQL, gatewayEventsTable(tables)),
		} {
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create the example's tables: %w", err)
	}
	return nil
}

// paymentsTable is the quoted name of the payments table.
func paymentsTable(t idem.Tables) string {
	return pgx.Identifier{t.WithDefaults().Schema, "payments"}.Sanitize()
}

// newLogger logs text to stderr at level.
func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// secretURL is a flag holding a URL, or a list of URLs, that may carry a
// password: its default shows in -h and in the usage text of a mistyped
// flag, which may land in a container's logs, so it shows redacted.
type secretURL struct{ p *string }

func (f secretURL) String() string {
	if f.p == nil {
		return ""
	}
	return amqpnodes.Redact(*f.p)
}

func (f secretURL) Set(s string) error { *f.p = s; return nil }
