package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The demo with -partitions: the worker consumes 4 partitions behind the
// queue's exchange, the publisher sends each deposit with its account as
// routing key, and every balance grows by exactly its distinct deposits.
func TestDemoOnPartitionsEveryBalanceGrowsByItsDistinctDeposits(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	testbroker.Dial(t)
	schema := testdb.Name(t, "qs")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
	queue := testbroker.Queue(t)
	testbroker.PartitionsAtEnd(t, queue, 4)
	o := options{pgURL: testdb.URL(), amqpURLs: []string{testbroker.URL()}, queue: queue, schema: schema,
		n: 1000, dup: 0.3, accounts: 7, partitions: 4}
	if err := demo(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
}
