package partitions_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
	"github.com/idemkit/idem/partitions"
)

// A worker consuming "postings" on 8 partitions, and a publisher sending
// one account's postings to it, in order.
func ExamplePublish() {
	ctx := context.Background()
	pool, tables, done := exampleenv.DB(ctx, "partitions", nil)
	defer done()
	queue := "example.postings." + tables.Schema
	amqpURL := exampleenv.AMQPURL()
	accountOf := func(m *consumer.Message) string { return m.RoutingKey }
	c, err := consumer.New(consumer.Config{
		Name:        "ledger-postings",
		Pool:        pool,
		Tables:      tables,
		AMQPURL:     amqpURL,
		Queue:       queue, // "postings"
		Partitions:  8,
		OrderingKey: func(m *consumer.Message) string { return accountOf(m) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer exampleenv.DeletePartitions(queue, 8)
	applied := make(chan string, 3)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		applied <- m.ID
		return nil
	})
	if err := c.Declare(ctx); err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = c.Run(runCtx) }()

	conn, ch := exampleenv.Channel()
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	account := "acct-17"
	for _, id := range []string{"posting-1", "posting-2", "posting-3"} {
		body := []byte(`{"amount":5}`)
		dc, err := partitions.Publish(ctx, ch, queue, 8, account, amqp.Publishing{MessageId: id, Body: body})
		if err != nil {
			log.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			log.Fatal("not confirmed: ", err)
		}
	}
	for range 3 {
		fmt.Println(<-applied)
	}
	// Output:
	// posting-1
	// posting-2
	// posting-3
}
