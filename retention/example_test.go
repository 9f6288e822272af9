package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
	"github.com/idemkit/idem/retention"
)

func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "retention", nil)
}

// One cleanup of every table idem owns, as `idem cleanup --older-than 720h`
// runs it.
func ExampleClean() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()

	res, err := retention.Clean(ctx, retention.Config{
		Pool:      pool,
		Tables:    tables,
		OlderThan: 30 * 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range res.Counts {
		fmt.Printf("%-17s %d\n", c.Table, c.Deleted)
	}
	// Output:
	// inbox             0
	// ledger            0
	// ledger_audit      0
	// ledger_tombstones 0
	// dead_letters      0
	// replay_runs       0
	// replay_audit      0
	// checkpoints       0
	// attempts          0
	// http_keys         0
}

// A cleanup below the floor is refused before anything is deleted.
func ExampleClean_floor() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()

	_, err := retention.Clean(ctx, retention.Config{Pool: pool, Tables: tables, OlderThan: 24 * time.Hour})
	fmt.Println(errors.Is(err, retention.ErrBelowFloor))

	// Going lower is a decision, stated in the configuration.
	_, err = retention.Clean(ctx, retention.Config{Pool: pool, Tables: tables, OlderThan: 24 * time.Hour, Floor: 24 * time.Hour})
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}

// A worker cleans in-process, beside its consumer; of all the workers
// running it, one cleans at a time.
func ExampleRun() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, tables, done := exampleDB(ctx)
	defer done()

	go func() {
		err := retention.Run(ctx, retention.Config{
			Pool:      pool,
			Tables:    tables,
			OlderThan: 30 * 24 * time.Hour,
			Interval:  time.Hour,
		})
		if err != nil {
			log.Printf("retention: %v", err) // an invalid Config; nothing was cleaned
		}
	}()
	// ... consumer.Run(ctx) ...
}
