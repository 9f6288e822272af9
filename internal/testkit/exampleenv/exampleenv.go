// Package exampleenv gives the runnable examples of idem's packages a fresh
// database schema and a broker to run against: what tests get from testdb
// and testbroker, for example code that has no *testing.T and stops with
// log.Fatal. IDEM_PG_URL and IDEM_AMQP_URL say where the services are.
package exampleenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/migrate"
)

// DB connects to PostgreSQL, migrates a fresh schema named after name, runs
// setup's SQL there (when setup is not nil; it gets the quoted schema), and
// returns a function that drops the schema and closes the pool.
func DB(ctx context.Context, name string, setup func(schema string) string) (*pgxpool.Pool, idem.Tables, func()) {
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		log.Fatal(err)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	tables := idem.Tables{Schema: "example_" + name + "_" + hex.EncodeToString(suffix[:])}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	s := tables.QuotedSchema()
	if setup != nil {
		if _, err := pool.Exec(ctx, setup(s)); err != nil {
			log.Fatal(err)
		}
	}
	return pool, tables, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+s+" CASCADE")
		pool.Close()
	}
}

// AMQPURL is the broker's URL.
func AMQPURL() string { return testbroker.URL() }

// Channel connects to the broker and opens a channel; closing the
// connection closes both.
func Channel() (*amqp.Connection, *amqp.Channel) {
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	return conn, ch
}

// Publish sends msg to queue through the default exchange, persistent and
// mandatory, and waits for the broker's confirm.
func Publish(queue string, msg amqp.Publishing) {
	conn, ch := Channel()
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg.DeliveryMode = amqp.Persistent
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		log.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		log.Fatalf("publish %s: not confirmed (%v)", msg.MessageId, err)
	}
}

// DeleteQueues removes queue and the retry and dead-letter queues a
// consumer declares for it.
func DeleteQueues(queue string) { Delete(amqpnames.Queues(queue, 0)...) }

// DeletePartitions removes what a consumer of queue with n partitions
// declares: its exchange, its partitions and their retry queues, and its
// dead-letter queue.
func DeletePartitions(queue string, n int) {
	Delete(amqpnames.Queues(queue, n)...)
	conn, ch := Channel()
	defer conn.Close()
	if err := ch.ExchangeDelete(amqpnames.PartitionExchange(queue), false, false); err != nil {
		log.Fatal(err)
	}
}

// Delete removes the named queues or streams.
func Delete(names ...string) {
	conn, ch := Channel()
	defer conn.Close()
	for _, q := range names {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			log.Fatal(err)
		}
	}
}
