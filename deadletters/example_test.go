package deadletters_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// The dead letters of one reason, newest first.
func ExampleList() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	// What a consumer writes when it gives up on a message.
	hash := idem.HashBytes([]byte(`{"amount":-5}`))
	_, err := pool.Exec(ctx, "INSERT INTO "+tables.Table("dead_letters")+
		` (consumer, message_id, payload_hash, reason, error, attempts) VALUES ('billing', 'm-7', $1, 'max_attempts', 'gateway down', 5)`,
		hash[:])
	if err != nil {
		log.Fatal(err)
	}

	recs, err := deadletters.List(ctx, pool, tables, deadletters.Filter{Reason: "max_attempts"})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Println(r.Consumer, r.MessageID, r.Reason, r.Attempts, r.Error, r.RedrivenAt.IsZero())
	}
	// Output:
	// billing m-7 max_attempts 5 gateway down true
}

// What waits for an operator, by consumer and reason: how many, since when.
func ExampleGroups() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	for _, r := range []struct{ consumer, reason, ago string }{
		{"billing", "max_attempts", "3 hours"}, {"billing", "max_attempts", "1 hour"}, {"shipping", "payload_conflict", "2 hours"},
	} {
		_, err := pool.Exec(ctx, "INSERT INTO "+tables.Table("dead_letters")+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
			VALUES ($1, 'm', sha256('m'), $2, now() - $3::interval)`, r.consumer, r.reason, r.ago)
		if err != nil {
			log.Fatal(err)
		}
	}

	groups, more, err := deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{By: deadletters.ByConsumerReason})
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range groups {
		fmt.Println(g.Consumer, g.Reason, g.Count, g.Newest.Sub(g.Oldest).Round(time.Hour))
	}
	fmt.Println("more:", more)
	// Output:
	// billing max_attempts 2 2h0m0s
	// shipping payload_conflict 1 0s
	// more: false
}

// Once the gateway is back, the messages that ran out of attempts go back to
// their queue, each row marked with who moved it, and the consumer
// processes them afresh.
func ExampleRedrive() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	queue := "example.payments." + tables.Schema
	var gatewayDown atomic.Bool
	gatewayDown.Store(true)
	c, err := consumer.New(consumer.Config{
		Name: "payments", Queue: queue, Pool: pool, Tables: tables, AMQPURL: amqpURL(),
		MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if gatewayDown.Load() {
			return errors.New("gateway down")
		}
		return nil
	})
	if err := c.Declare(ctx); err != nil {
		log.Fatal(err)
	}
	defer deleteQueues(queue)
	publish(queue, "m-7")
	runUntil(c, func(s consumer.Stats) bool { return s.DeadLettered == 1 })

	gatewayDown.Store(false)
	res, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{
		AMQPURL:  amqpURL(),
		Pool:     pool,
		Tables:   tables,
		Queue:    queue,
		Reason:   "max_attempts",
		Operator: "alice",
	})
	if err != nil {
		log.Fatal(err) // what was not moved is still in the dead-letter queue
	}
	fmt.Printf("moved %d of %d messages looked at, %d rows marked\n", res.Moved, res.Scanned, res.Marked)
	runUntil(c, func(s consumer.Stats) bool { return s.Processed == 1 })
	fmt.Println("processed after the redrive")
	// Output:
	// moved 1 of 1 messages looked at, 1 rows marked
	// processed after the redrive
}

// runUntil runs c until its statistics satisfy done, at most 30 seconds.
func runUntil(c *consumer.Consumer, done func(consumer.Stats) bool) {
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !done(c.Stats()) {
		if time.Now().After(deadline) {
			log.Fatalf("not done in 30s: %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
}

func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "deadletters", nil)
}

// publish sends one persistent message with a message id, confirmed.
func publish(queue, id string) {
	exampleenv.Publish(queue, amqp.Publishing{MessageId: id, Body: []byte(`{"amount":5}`)})
}

func deleteQueues(queue string) { exampleenv.DeleteQueues(queue) }

func amqpURL() string { return exampleenv.AMQPURL() }
