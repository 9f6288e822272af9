package consumer_test

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
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// A projection kept from a stream: the handler is an ordinary consumer
// handler; Run reads the Stream in order and checkpoints each batch in its
// transaction. Declare declares the stream before anything is published
// to it. A copy of an event (same id, same body) is a duplicate.
func Example_stream() {
	ctx := context.Background()
	pool, tables, done := streamExampleDB(ctx)
	defer done()
	name := "example.orders." + tables.Schema
	defer exampleenv.Delete(name)

	c, err := consumer.New(consumer.Config{
		Name:    "orders-projection",
		Stream:  name,
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
	if err := c.Declare(ctx); err != nil { // the stream exists from here on
		log.Fatal(err)
	}
	events := []string{"o-1:placed", "o-1:paid", "o-1:paid"}
	for _, e := range events {
		exampleenv.Publish(name, amqp.Publishing{MessageId: e, Body: []byte(e), Timestamp: time.Now()})
	}

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for s := c.Stats(); s.Processed+s.Duplicates < int64(len(events)); s = c.Stats() {
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

// streamExampleDB migrates a fresh schema with the stream example's table;
// the function it returns drops it.
func streamExampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "stream", func(s string) string {
		return `CREATE TABLE ` + s + `.events (stream_offset bigint PRIMARY KEY, body text NOT NULL)`
	})
}
