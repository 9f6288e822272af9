package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/migrate"
)

// A worker: a handler that increments a balance, run over a queue until the
// process is told to stop. Every delivery of the same message id applies the
// increment once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, idem.Tables{}); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Name:    "billing",
		Queue:   "invoices",
		Pool:    pool,
		AMQPURL: os.Getenv("IDEM_AMQP_URL"),
	})
	if err != nil {
		log.Fatal(err)
	}
	type deposit struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		_, err := tx.Exec(ctx, `UPDATE balances SET balance = balance + $2 WHERE account = $1`, d.Account, d.Amount)
		return err
	}))
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}

// Process runs messages through the same pipeline as Run without a broker:
// here the same message three times and one reuse of its id with another
// payload.
func ExampleConsumer_Process() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tables := idem.Tables{Schema: "idem_example_process"}
	pool.Exec(ctx, `DROP SCHEMA IF EXISTS "idem_example_process" CASCADE`) // a fresh start
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA "idem_example_process" CASCADE`)

	c, err := consumer.New(consumer.Config{Name: "example", Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		runs++
		return nil
	})
	msg := consumer.Incoming{MessageID: "m-1", Body: []byte(`{"amount":5}`)}
	other := consumer.Incoming{MessageID: "m-1", Body: []byte(`{"amount":500}`)}
	out, err := c.Process(ctx, []consumer.Incoming{msg, msg, msg, other})
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range out {
		fmt.Println(strings.TrimSpace(o.MessageID + " " + o.Result.String() + " " + o.Reason))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// m-1 processed
	// m-1 duplicate
	// m-1 duplicate
	// m-1 dead_lettered payload_conflict
	// handler runs: 1
}

func pgURL() string {
	if u := os.Getenv("IDEM_PG_URL"); u != "" {
		return u
	}
	return "postgres://root@127.0.0.1:5432/test?sslmode=disable"
}
