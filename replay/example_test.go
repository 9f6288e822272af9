package replay_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/stream"
	"github.com/idemkit/idem/replay"
)

// newConsumer is the worker's stream consumer, with its handler.
func newConsumer(pool *pgxpool.Pool) *consumer.Consumer {
	c, err := consumer.New(consumer.Config{Name: "overview", Pool: pool, Stream: "orders.events",
		AMQPURL: os.Getenv("IDEM_AMQP_URL")})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO overview (id, body) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body`, m.ID, m.Body)
		return err
	})
	return c
}

// Rebuild the projection from the whole stream: reset it, replay into it
// with effects suppressed, and hand the live consumer over at the end.
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	s, err := replay.Run(ctx, newConsumer(pool), replay.Options{
		Mode: idem.Rebuild,
		Reset: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `TRUNCATE overview`)
			return err
		},
		Progress: os.Stderr,
	})
	if err != nil {
		log.Fatal(err) // resumable: run again with RunID: s.RunID
	}
	fmt.Printf("rebuilt %d messages; live consumption continues after offset %d\n", s.Processed, s.Handoff)
}

// A worker binary with a replay subcommand next to its worker:
//
//	worker
//	replay --mode forensic --from 2025-01-31T00:00:00Z --report audit.jsonl
//	replay --mode repair --key o-17 --reason "INC-42"
func ExampleMain() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	c := newConsumer(pool)
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "replay" {
		err = replay.Main(ctx, c, args[1:], replay.Command{})
	} else {
		err = stream.Run(ctx, c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(replay.ExitCode(err))
}
