package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The demo is the quickstart's end-to-end check: deposits with duplicates
// and bad messages through a real broker and database, every balance
// growing by exactly its distinct deposits.
func TestDemoEveryBalanceGrowsByItsDistinctDeposits(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t) // skips, or fails under CI, without PostgreSQL
	testbroker.Dial(t)     // the same for RabbitMQ
	schema := testdb.Name(t, "qs")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
	o := options{pgURL: testdb.URL(), amqpURLs: []string{testbroker.URL()}, queue: testbroker.Queue(t), schema: schema,
		n: 1000, dup: 0.3, accounts: 7}
	if err := demo(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
}
