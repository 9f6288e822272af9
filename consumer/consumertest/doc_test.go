package consumertest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// The package documentation's examples, compiled and run.

type Deposit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func testPool(t *testing.T) *pgxpool.Pool { return testdb.Pool(t) }

var applyDeposit = consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d Deposit) error {
	if d.Amount <= 0 {
		return consumer.DeadLetter("invalid_deposit", errors.New("amount must be positive"))
	}
	return consumer.Defer(ctx, tx, `SELECT $1::text, $2::bigint`, d.Account, d.Amount) // your business write
})

func TestDepositAppliesOnce(t *testing.T) {
	pool := testPool(t) // your test database
	tables := consumertest.Schema(t, pool)
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(applyDeposit)
	m := consumertest.MessageJSON("m-1", Deposit{Account: "A1", Amount: 5})
	out := consumertest.Deliver(t, c, consumertest.Times(3, m)...)
	consumertest.RequireProcessed(t, out, "m-1")
	consumertest.RequireDuplicates(t, out, "m-1", 2)
}

func TestInvalidDepositIsDeadLettered(t *testing.T) {
	pool := testPool(t)
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: consumertest.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(applyDeposit)
	out := consumertest.DeliverEach(t, c,
		consumertest.MessageJSON("m-1", Deposit{Account: "A1", Amount: -5}),
		consumertest.Message("m-2", []byte(`{"account":`)),
	)
	consumertest.RequireDeadLettered(t, out, "m-1", "invalid_deposit")
	consumertest.RequireDeadLettered(t, out, "m-2", "decode_error")
}
