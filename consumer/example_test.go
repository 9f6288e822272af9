package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/pgnodes"
)

// A worker: a handler that adds deposits to balances, run over a queue
// until the process is told to stop. Every delivery of one message id
// applies the deposit once.
func Example() {
	ctx := context.Background()
	pool, err := pgnodes.New(ctx, os.Getenv("IDEM_PG_URL")) // a host that stops answering costs seconds
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool, idem.Tables{}); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Name:    "billing",
		Queue:   "deposits",
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
		return consumer.Defer(ctx, tx, `UPDATE balances SET balance = balance + $2 WHERE account = $1`, d.Account, d.Amount)
	}))
	if err := c.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}

// Run against a real broker: three deliveries, one of them a copy of
// another, apply two deposits. Run returns nil once its context is
// cancelled and the batches in flight have committed and acked.
func ExampleConsumer_Run() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	queue := "example.deposits." + tables.Schema
	c, err := consumer.New(consumer.Config{
		Name:    "billing",
		Queue:   queue,
		Pool:    pool,
		Tables:  tables,
		AMQPURL: amqpURL(),
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		return consumer.Defer(ctx, tx, `UPDATE `+tables.QuotedSchema()+`.balances SET balance = balance + $2 WHERE account = $1`,
			d.Account, d.Amount)
	}))
	if err := c.Declare(ctx); err != nil { // the queues exist before anyone publishes
		log.Fatal(err)
	}
	defer deleteQueues(queue)
	publish(queue, "m-1", `{"account":"A1","amount":5}`)
	publish(queue, "m-2", `{"account":"A1","amount":7}`)
	publish(queue, "m-1", `{"account":"A1","amount":5}`) // the broker delivers m-1 again

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for s := c.Stats(); s.Processed+s.Duplicates < 3; s = c.Stats() {
		if time.Now().After(deadline) {
			log.Fatalf("not settled in 30s: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	s := c.Stats()
	fmt.Println("processed", s.Processed, "duplicates", s.Duplicates, "balance", balance(ctx, pool, tables, "A1"))
	// Output:
	// processed 2 duplicates 1 balance 12
}

// Process runs messages through the same pipeline as Run without a broker:
// here the same message three times and one reuse of its id with another
// payload.
func ExampleConsumer_Process() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()

	c, err := consumer.New(consumer.Config{Name: "example", Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		runs++
		return nil
	})
	msg := consumer.Message{MessageID: "m-1", Body: []byte(`{"amount":5}`)}
	other := consumer.Message{MessageID: "m-1", Body: []byte(`{"amount":500}`)}
	out, err := c.Process(ctx, []consumer.Message{msg, msg, msg, other})
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range out {
		fmt.Println(strings.TrimSpace(o.Message.ID + " " + o.Outcome.String() + " " + o.Reason))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// m-1 processed
	// m-1 duplicate
	// m-1 duplicate
	// m-1 dead_lettered payload_conflict
	// handler runs: 1
}

// A write-only handler defers its statement: the batch's deferred
// statements go out together, in order, in one round trip just before the
// commit. Increments commute, so no handler of the batch needs to read them
// back first.
func ExampleDefer() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	increment := `UPDATE ` + tables.QuotedSchema() + `.balances SET balance = balance + $2 WHERE account = $1`
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		return consumer.Defer(ctx, tx, increment, d.Account, d.Amount)
	}))
	_, err = c.Process(ctx, []consumer.Message{
		{MessageID: "m-1", Body: []byte(`{"account":"A1","amount":5}`)},
		{MessageID: "m-2", Body: []byte(`{"account":"A1","amount":7}`)},
		{MessageID: "m-1", Body: []byte(`{"account":"A1","amount":5}`)},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("A1:", balance(ctx, pool, tables, "A1"))
	// Output:
	// A1: 12
}

// JSON decodes the body into the handler's type; a body that does not
// decode is dead-lettered with reason decode_error before the handler runs.
// The handler decides the rest: nil commits, DeadLetter and Permanent give
// up on the message, any other error retries it.
func ExampleJSON() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	increment := `UPDATE ` + tables.QuotedSchema() + `.balances SET balance = balance + $2 WHERE account = $1`
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		if d.Amount <= 0 {
			return consumer.DeadLetter("invalid_deposit", fmt.Errorf("amount %d", d.Amount))
		}
		if d.Account == "frozen" {
			return errors.New("account frozen for now") // retried later
		}
		return consumer.Defer(ctx, tx, increment, d.Account, d.Amount)
	}))
	out, err := c.Process(ctx, []consumer.Message{
		{MessageID: "m-1", Body: []byte(`{"account":"A1","amount":5}`)},
		{MessageID: "m-2", Body: []byte(`{"account":"A1","amount":-5}`)},
		{MessageID: "m-3", Body: []byte(`{"account":`)},
		{MessageID: "m-4", Body: []byte(`{"account":"frozen","amount":5}`)},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range out {
		fmt.Println(strings.TrimSpace(o.Message.ID + " " + o.Outcome.String() + " " + o.Reason))
	}
	// Output:
	// m-1 processed
	// m-2 dead_lettered invalid_deposit
	// m-3 dead_lettered decode_error
	// m-4 retried
}

// A set-based batch handler writes all of a batch's new messages with one
// statement. When it fails, the batch runs again message by message with
// the Handle handler, so Handle is still required and must do the same.
func ExampleConsumer_HandleBatch() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	c, err := consumer.New(consumer.Config{Name: "audit", Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	events := tables.QuotedSchema() + `.events`
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Defer(ctx, tx, `INSERT INTO `+events+` (id, body) VALUES ($1, $2)`, m.ID, string(m.Body))
	})
	c.HandleBatch(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		ids, bodies := make([]string, len(msgs)), make([]string, len(msgs))
		for i, m := range msgs {
			ids[i], bodies[i] = m.ID, string(m.Body)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+events+` (id, body) SELECT * FROM unnest($1::text[], $2::text[])`, ids, bodies)
		return err
	})
	_, err = c.Process(ctx, []consumer.Message{
		{MessageID: "e-1", Body: []byte(`placed`)},
		{MessageID: "e-2", Body: []byte(`paid`)},
		{MessageID: "e-1", Body: []byte(`placed`)}, // a duplicate never reaches the handlers
	})
	if err != nil {
		log.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+events).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("events:", n)
	// Output:
	// events: 2
}

type deposit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// exampleDB migrates a fresh schema with the examples' tables; the
// function it returns drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "consumer", func(s string) string {
		return `CREATE TABLE ` + s + `.balances (account text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO ` + s + `.balances VALUES ('A1', 0);
		CREATE TABLE ` + s + `.events (id text PRIMARY KEY, body text NOT NULL)`
	})
}

func balance(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, account string) int64 {
	var b int64
	err := pool.QueryRow(ctx, `SELECT balance FROM `+tables.QuotedSchema()+`.balances WHERE account = $1`, account).Scan(&b)
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// publish sends one persistent JSON message with a message id, confirmed.
func publish(queue, id, body string) {
	exampleenv.Publish(queue, amqp.Publishing{MessageId: id, Body: []byte(body), ContentType: "application/json"})
}

func deleteQueues(queue string) { exampleenv.DeleteQueues(queue) }

func amqpURL() string { return exampleenv.AMQPURL() }
