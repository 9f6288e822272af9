package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/migrate"
)

// The handler's writes and the claim commit together: a redelivered message
// finds its row and is skipped.
func ExampleInbox_Claim() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tables := idem.Tables{Schema: "shop"}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"order":"o-1","cents":1250}`)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
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
			_, err = tx.Exec(ctx, "UPDATE orders SET paid = true WHERE id = 'o-1'")
			return err
		case inbox.Duplicate:
			return nil // processed before: ack without running the handler
		default: // inbox.Conflict: the id was reused for another payload
			return fmt.Errorf("dead-letter: payload %s, stored %s", idem.HashBytes(body).Short(), res.StoredHash.Short())
		}
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A batch of deliveries in one transaction: claim all at once, run each
// handler under a savepoint, and unclaim the ones whose handler failed so
// that their redelivery is processed.
func ExampleInbox_ClaimBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ib, err := inbox.New(inbox.Config{Tables: idem.Tables{Schema: "shop"}})
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
}

// Batches that are expected to be new take the cheap plain INSERT; a batch
// that meets a message claimed already is run again with ClaimBatch in a new
// transaction, which decides its duplicates and conflicts.
func ExampleInbox_ClaimNewBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ib, err := inbox.New(inbox.Config{Tables: idem.Tables{Schema: "shop"}})
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
	err = process(ib.ClaimNewBatch)
	if errors.Is(err, inbox.ErrClaimed) {
		err = process(ib.ClaimBatch) // the first transaction rolled back
	}
	if err != nil {
		log.Fatal(err)
	}
}
