package replaycmd_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/projection"
	"github.com/idemkit/idem/replay"
	"github.com/idemkit/idem/replay/replaycmd"
)

// overview declares the projection's table, so that it can be rebuilt
// online.
var overview, _ = projection.New(projection.Config{Name: "overview", Tables: []string{"overview"}})

// newConsumer is the worker's stream consumer, with its handler.
func newConsumer(pool *pgxpool.Pool) *consumer.Consumer {
	c, err := consumer.New(consumer.Config{Name: "overview", Stream: "orders.events", Pool: pool, AMQPURL: os.Getenv("IDEM_AMQP_URL")})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+overview.Table(ctx, "overview")+` (id, body) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body`, m.ID, m.Body)
		return err
	})
	return c
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
	err = run(ctx, c, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(replaycmd.ExitCode(err))
}

// run runs the worker or the replay subcommand.
func run(ctx context.Context, c *consumer.Consumer, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: want worker or replay", replaycmd.ErrUsage)
	}
	switch args[0] {
	case "worker":
		return c.Run(ctx)
	case "replay":
		return replaycmd.Main(ctx, c, args[1:], replaycmd.Command{Options: replay.Options{Projection: overview}})
	}
	return fmt.Errorf("%w: unknown command %q", replaycmd.ErrUsage, args[0])
}
