package deadletters_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/migrate"
)

// The dead letters of one reason, newest first.
func ExampleList() {
	ctx := context.Background()
	url := os.Getenv("IDEM_PG_URL")
	if url == "" {
		url = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	tables := idem.Tables{Schema: "example_deadletters_" + hex.EncodeToString(suffix[:])}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+tables.QuotedSchema()+" CASCADE")
	// What a consumer writes when it gives up on a message.
	hash := idem.HashBytes([]byte(`{"amount":-5}`))
	_, err = pool.Exec(ctx, "INSERT INTO "+tables.Table("dead_letters")+
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

// Once the gateway is back, the messages that ran out of attempts go back to
// their queue, each row marked with who moved it.
func ExampleRedrive() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	res, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{
		AMQPURL:  os.Getenv("IDEM_AMQP_URL"),
		Pool:     pool,
		Queue:    "payments.capture.requested",
		Reason:   "max_attempts",
		Operator: "alice",
	})
	if err != nil {
		log.Fatal(err) // what was not moved is still in the dead-letter queue
	}
	fmt.Printf("moved %d of %d messages looked at\n", res.Moved, res.Scanned)
}
