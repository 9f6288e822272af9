package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// The handler's write and the claim commit together: a redelivered message
// finds its row and is skipped, and a message that reuses the id for
// another payload is a conflict.
func ExampleInbox_Claim() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	pay := `UPDATE ` + tables.QuotedSchema() + `.orders SET paid = paid + 1 WHERE id = 'o-1'`

	deliver := func(body []byte) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.Claim(ctx, tx, inbox.Claim{
				Consumer:    "billing",
				MessageID:   "msg-0001",
				PayloadHash: idem.HashBytes(body),
				BusinessKey: "o-1",
				Source:      "orders",
			})
			if err != nil {
				return err
			}
			switch res.Decision {
			case inbox.NewMessage:
				_, err = tx.Exec(ctx, pay) // the handler's write, in the claim's transaction
				return err
			case inbox.Duplicate:
				return nil // processed before: ack without running the handler
			default: // inbox.Conflict: the id was reused for another payload
				fmt.Println("conflict: payload", idem.HashBytes(body).Short(), "stored", res.StoredHash.Short())
				return nil // dead-letter it; never process it, never ack it as a duplicate
			}
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	deliver([]byte(`{"order":"o-1","cents":1250}`))
	deliver([]byte(`{"order":"o-1","cents":1250}`)) // the broker delivers it again
	deliver([]byte(`{"order":"o-1","cents":9999}`)) // a producer reuses the id

	var paid int
	if err := pool.QueryRow(ctx, `SELECT paid FROM `+tables.QuotedSchema()+`.orders`).Scan(&paid); err != nil {
		log.Fatal(err)
	}
	fmt.Println("paid", paid, "time(s)")
	// Output:
	// conflict: payload fdc54dca15dd stored 5c6abac06402
	// paid 1 time(s)
}

// A batch of deliveries in one transaction: claim all at once, run each
// handler under a savepoint, and unclaim the ones whose handler failed so
// that their redelivery is processed.
func ExampleInbox_ClaimBatch() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, tx pgx.Tx, c inbox.Claim) error {
		if c.MessageID == "msg-2" {
			return errors.New("downstream row is locked")
		}
		return nil
	}

	claims := []inbox.Claim{
		{Consumer: "billing", MessageID: "msg-1", PayloadHash: idem.HashBytes([]byte("one"))},
		{Consumer: "billing", MessageID: "msg-2", PayloadHash: idem.HashBytes([]byte("two"))},
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		results, err := ib.ClaimBatch(ctx, tx, claims)
		if err != nil {
			return err
		}
		for i, c := range claims {
			if results[i].Decision != inbox.NewMessage {
				continue // duplicates are acked, conflicts dead-lettered
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT msg"); err != nil {
				return err
			}
			if herr := handle(ctx, tx, c); herr != nil {
				if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT msg"); err != nil {
					return err
				}
				if err := ib.Unclaim(ctx, tx, c.Consumer, c.MessageID); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT msg"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range claims {
		_, err := ib.Lookup(ctx, pool, c.Consumer, c.MessageID)
		fmt.Println(c.MessageID, "recorded:", err == nil)
	}
	// Output:
	// msg-1 recorded: true
	// msg-2 recorded: false
}

// Batches that are expected to be new take the cheap plain INSERT; a batch
// that meets a message claimed already is run again with ClaimBatch in a new
// transaction, which decides its duplicates and conflicts.
func ExampleInbox_ClaimNewBatch() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	batch := []inbox.Claim{
		{Consumer: "projection", MessageID: "evt-41", PayloadHash: idem.HashBytes([]byte(`{"n":41}`))},
		{Consumer: "projection", MessageID: "evt-42", PayloadHash: idem.HashBytes([]byte(`{"n":42}`))},
	}
	process := func(claim func(context.Context, pgx.Tx, []inbox.Claim) ([]inbox.Result, error)) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			results, err := claim(ctx, tx, batch)
			if err != nil {
				return err
			}
			for i, res := range results {
				if res.Decision == inbox.NewMessage {
					fmt.Println("apply", batch[i].MessageID) // the handler's writes, in tx
				}
			}
			return nil
		})
	}
	for range 2 { // the second time, both are claimed already
		err = process(ib.ClaimNewBatch)
		if errors.Is(err, inbox.ErrClaimed) {
			fmt.Println("claimed already: run the batch again with ClaimBatch")
			err = process(ib.ClaimBatch) // the first transaction rolled back
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// apply evt-41
	// apply evt-42
	// claimed already: run the batch again with ClaimBatch
}

// exampleDB migrates a fresh schema with the examples' table; the function
// it returns drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "inbox", func(s string) string {
		return `CREATE TABLE ` + s + `.orders (id text PRIMARY KEY, paid int NOT NULL);
		INSERT INTO ` + s + `.orders VALUES ('o-1', 0)`
	})
}
