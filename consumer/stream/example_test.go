package stream_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/stream"
	"github.com/idemkit/idem/internal/exampleenv"
)

// A projection kept from a stream: the handler is an ordinary consumer
// handler; stream.Run reads in order and checkpoints each batch in its
// transaction. A copy of an event (same id, same body) is a duplicate.
func ExampleRun() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	name := "example.orders." + tables.Schema
	events := declareStream(name, "o-1:placed", "o-1:paid", "o-1:paid")
	defer deleteStream(name)

	c, err := consumer.New(consumer.Config{
		Name:    "orders-projection",
		Pool:    pool,
		Tables:  tables,
		AMQPURL: amqpURL(),
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Defer(ctx, tx, `INSERT INTO `+tables.QuotedSchema()+`.events (stream_offset, body) VALUES ($1, $2)`,
			m.Offset, string(m.Body))
	})
	s, err := stream.New(c, stream.Config{Stream: name})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- stream.Run(runCtx, s) }()
	deadline := time.Now().Add(30 * time.Second)
	for s := c.Stats(); s.Processed+s.Duplicates < int64(events); s = c.Stats() {
		if time.Now().After(deadline) {
			log.Fatalf("not settled in 30s: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT stream_offset, body FROM `+tables.QuotedSchema()+`.events ORDER BY stream_offset`)
	if err != nil {
		log.Fatal(err)
	}
	for rows.Next() {
		var offset int64
		var body string
		if err := rows.Scan(&offset, &body); err != nil {
			log.Fatal(err)
		}
		fmt.Println(offset, body)
	}
	fmt.Println("duplicates:", c.Stats().Duplicates)
	// Output:
	// 0 o-1:placed
	// 1 o-1:paid
	// duplicates: 1
}

// declareStream creates a stream and publishes bodies to it, each with its
// body as message id, and returns how many it published.
func declareStream(name string, bodies ...string) int {
	conn, ch := exampleenv.Channel()
	defer conn.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		log.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range bodies {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", name, true, false,
			amqp.Publishing{MessageId: b, Body: []byte(b), DeliveryMode: amqp.Persistent, Timestamp: time.Now()})
		if err != nil {
			log.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			log.Fatalf("publish %s: not confirmed (%v)", b, err)
		}
	}
	return len(bodies)
}

func deleteStream(name string) { exampleenv.Delete(name) }

// exampleDB migrates a fresh schema with the examples' table; the function
// it returns drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "stream", func(s string) string {
		return `CREATE TABLE ` + s + `.events (stream_offset bigint PRIMARY KEY, body text NOT NULL)`
	})
}

func amqpURL() string { return exampleenv.AMQPURL() }
