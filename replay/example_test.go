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
	"github.com/idemkit/idem/projection"
	"github.com/idemkit/idem/replay"
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
		// The live table, or its shadow during a rebuild.
		_, err := tx.Exec(ctx, `INSERT INTO `+overview.Table(ctx, "overview")+` (id, body) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body`, m.ID, m.Body)
		return err
	})
	return c
}

// Rebuild the projection from the whole stream while the live workers run:
// into shadow tables, effects suppressed, then swapped in atomically.
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	s, err := replay.Run(ctx, newConsumer(pool), replay.Options{
		Mode:       idem.Rebuild,
		Projection: overview,
		Progress:   os.Stderr,
	})
	if err != nil {
		log.Fatal(err) // resumable: run again with RunID: s.RunID, or replay.Abandon it
	}
	fmt.Printf("rebuilt %d messages; swapped in at offset %d, the live worker paused %s\n", s.Processed, s.Handoff, s.Pause)
}

// Rebuild in place, for a handler whose tables are not declared: the live
// workers pause (Wait: until they let go of the stream), the projection is
// truncated, and the live consumer continues after the rebuild's end.
func ExampleRun_inPlace() {
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
		Wait: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rebuilt %d messages; live consumption continues after offset %d\n", s.Processed, s.Handoff)
}

// Give up an interrupted online rebuild: its shadow tables are dropped, the
// live projection is untouched.
func ExampleAbandon() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := replay.Abandon(ctx, pool, idem.Tables{}, "20250131T120000-1a2b3c4d"); err != nil {
		log.Fatal(err)
	}
}
