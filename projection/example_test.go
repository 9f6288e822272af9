package projection_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/projection"
)

// The handler of a projection builds its SQL with Table: the live table
// here, its shadow copy while a rebuild runs the same handler.
func ExampleProjection_Table() {
	overview, err := projection.New(projection.Config{Name: "order_overview", Schema: "orders",
		Tables: []string{"order_overview"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(overview.Table(context.Background(), "order_overview"))
	// Output: "orders"."order_overview"
}

// orderEvent is an event of the orders stream.
type orderEvent struct {
	OrderID string `json:"orderId"`
	Version int64  `json:"version"`
	Status  string `json:"status"`
}

// A consumer's handler applies each event newest-wins: a stale event is a
// no-op, an event after a gap waits for the missing versions (GapPark).
// Effects are recorded only for events that applied.
func ExampleNewGuard() {
	overview, err := projection.New(projection.Config{Name: "order_overview", Schema: "orders",
		Tables: []string{"order_overview"}})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := projection.NewGuard(projection.GuardConfig[orderEvent]{
		Projection: overview, Table: "order_overview", KeyColumn: "order_id", VersionColumn: "version",
		Gaps:    projection.GapPark,
		Tables:  idem.Tables{Schema: "orders"}, // the consumer's Config.Tables
		Key:     func(ev orderEvent) string { return ev.OrderID },
		Version: func(ev orderEvent) int64 { return ev.Version },
		Apply: func(ctx context.Context, tx pgx.Tx, ev orderEvent) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+overview.Table(ctx, "order_overview")+
				` (order_id, status, version, updated_at) VALUES ($1, $2, $3, $4)
				ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version,
					updated_at = EXCLUDED.updated_at`, ev.OrderID, ev.Status, ev.Version, time.Now())
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	handle := consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, ev orderEvent) error {
		if ev.OrderID == "" || ev.Version < 1 {
			return consumer.DeadLetter("invalid_event", errors.New("want orderId and version ≥ 1"))
		}
		decision, err := guard.Handle(ctx, tx, ev)
		if err != nil || decision != projection.Applied {
			return err
		}
		// Record the effects of an applied event here (ledger.Record).
		return nil
	})
	_ = handle // c.Handle(handle)
}
