package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
)

// bodySize is the size of every event's body.
const bodySize = 256

// encode builds an event's body: account (4 bytes), seq (4 bytes), filler.
func encode(account, seq int) []byte {
	body := make([]byte, bodySize)
	binary.BigEndian.PutUint32(body[0:], uint32(account))
	binary.BigEndian.PutUint32(body[4:], uint32(seq))
	for i := 8; i < bodySize; i++ {
		body[i] = 'a' + byte(i%26)
	}
	return body
}

func accountOf(body []byte) int32 { return int32(binary.BigEndian.Uint32(body)) }

func seqOf(body []byte) int32 { return int32(binary.BigEndian.Uint32(body[4:])) }

// applySQL applies an event in one statement: the account's last seq
// becomes the event's, the one it replaces is kept in prev (an UPDATE's SET
// reads the row version it writes, so two processes applying one account
// see each other's events in the order they committed), an event that does
// not follow prev is recorded in violations, and the event in applied with
// the time the handler ran.
const applySQL = `WITH u AS (UPDATE %[1]s.last_seq SET prev = seq, seq = $2 WHERE account = $1 RETURNING prev),
	v AS (INSERT INTO %[1]s.violations (account, seq, after) SELECT $1, $2, prev FROM u WHERE prev <> $2 - 1)
	INSERT INTO %[1]s.applied (message_id, label, part, redelivered, at) VALUES ($3, $4, $5, $6, clock_timestamp())`

// appName is the application_name of a worker's PostgreSQL sessions.
func appName(schema, label string) string { return schema + "/" + label }

// workerStats is what a worker process prints on its way out.
type workerStats struct {
	Processed, Duplicates, DeadLettered, Retried, Batches int64
}

// worker is one worker process: the consumer o.child (the queue is its name)
// with OrderingKey = account, o.parts partitions, and the order-checking
// handler.
func worker(ctx context.Context, o options) error {
	pcfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return err
	}
	// The lease's session has the pool's settings: its locks are found by
	// this name (waitSettled).
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName(o.schema, o.label)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := idem.Tables{Schema: o.schema}
	level := slog.LevelWarn
	if os.Getenv("IDEM_BENCH_DEBUG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("label", o.label)
	c, err := consumer.New(consumer.Config{Name: o.child, Pool: pool, Queue: o.child, AMQPURL: o.amqpURL,
		Tables: tables, Logger: logger, Partitions: o.parts,
		OrderingKey: func(m *consumer.Message) string { return strconv.Itoa(int(accountOf(m.Body))) }})
	if err != nil {
		return err
	}
	apply := fmt.Sprintf(applySQL, tables.QuotedSchema())
	label := o.label
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		args := []any{accountOf(m.Body), seqOf(m.Body), m.ID, label, m.Source, m.Redelivered || m.DeliveryCount > 0}
		if o.deferred {
			return consumer.Defer(ctx, tx, apply, args...)
		}
		_, err := tx.Exec(ctx, apply, args...)
		return err
	})
	if o.cpuprofile != "" {
		f, err := os.Create(fmt.Sprintf("%s-%s-%s.pprof", o.cpuprofile, o.child, o.label))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if err := c.Run(ctx); err != nil {
		return err
	}
	s := c.Stats()
	return json.NewEncoder(os.Stdout).Encode(workerStats{Processed: s.Processed, Duplicates: s.Duplicates,
		DeadLettered: s.DeadLettered, Retried: s.Retried, Batches: s.Batches})
}
