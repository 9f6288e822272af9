package consumertest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

type deposit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func newDepositConsumer(t *testing.T) (*consumer.Consumer, func() int64) {
	pool := testdb.Pool(t)
	tables := consumertest.Schema(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+tables.QuotedSchema()+`.balances (account text PRIMARY KEY, balance bigint NOT NULL)`)
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{Name: "deposits", Pool: pool, Tables: tables})
	require.NoError(t, err)
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
		if d.Amount <= 0 {
			return consumer.Permanent(errors.New("amount must be positive"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+tables.QuotedSchema()+`.balances AS b VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET balance = b.balance + EXCLUDED.balance`, d.Account, d.Amount)
		return err
	}))
	balance := func() int64 {
		var b int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM `+tables.QuotedSchema()+`.balances`).Scan(&b))
		return b
	}
	return c, balance
}

func TestDeliverTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	c, balance := newDepositConsumer(t)
	out := consumertest.Deliver(t, c, consumertest.Times(3, consumertest.MessageJSON("m-1", deposit{"A1", 5}))...)
	consumertest.RequireProcessed(t, out, "m-1")
	consumertest.RequireDuplicates(t, out, "m-1", 2)
	out = consumertest.DeliverEach(t, c, consumertest.MessageJSON("m-1", deposit{"A1", 5}))
	consumertest.RequireDuplicates(t, out, "m-1", 1)
	require.EqualValues(t, 5, balance())
}

func TestDeliverReportsDeadLetters(t *testing.T) {
	t.Parallel()
	c, balance := newDepositConsumer(t)
	out := consumertest.DeliverEach(t, c,
		consumertest.MessageJSON("m-1", deposit{"A1", 5}),
		consumertest.MessageJSON("m-1", deposit{"A1", 6}),
		consumertest.Message("m-2", []byte(`{not json`)),
		consumertest.MessageJSON("m-3", deposit{"A1", -1}),
		consumertest.MessageJSON("", deposit{"A1", 1}),
	)
	consumertest.RequireProcessed(t, out, "m-1")
	consumertest.RequireDeadLettered(t, out, "m-1", deadletters.ReasonPayloadConflict)
	consumertest.RequireDeadLettered(t, out, "m-2", deadletters.ReasonDecodeError)
	consumertest.RequireDeadLettered(t, out, "m-3", deadletters.ReasonPermanent)
	consumertest.RequireDeadLettered(t, out, "", deadletters.ReasonMissingMessageID)
	require.Equal(t, map[idem.Outcome]int{idem.Processed: 1, idem.DeadLettered: 4}, consumertest.Outcomes(out))
	require.EqualValues(t, 5, balance())
}
