package main

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testdb"
)

func TestDeadLettersListShowsReasonAndFilters(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
	require.NoError(t, err)
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Permanent(errors.New("card expired"))
	})
	_, err = c.Process(context.Background(), []consumer.Incoming{
		{MessageID: "m-1", Body: []byte(`{}`)},
		{Body: []byte(`{}`)},
	})
	require.NoError(t, err)

	out, stderr, code := runInboxCmd(t, tables, "deadletters", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "m-1")
	require.Contains(t, out, "card expired")
	require.Contains(t, out, deadletters.ReasonMissingMessageID)

	out, stderr, code = runInboxCmd(t, tables, "deadletters", "list", "--reason", deadletters.ReasonPermanent)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "m-1")
	require.NotContains(t, out, deadletters.ReasonMissingMessageID)

	_, _, code = runInboxCmd(t, tables, "deadletters")
	require.Equal(t, 2, code)
}
