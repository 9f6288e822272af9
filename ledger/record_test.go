package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ledger"
)

func TestRecordingTwiceKeepsOneEntryAndCallsTargetOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	tg := newTarget(t, ok)
	e := ledger.Effect{Type: "mail.send", BusinessKey: "order-1", Target: tg.URL, Request: map[string]string{"to": "a@example.com"}}

	first := f.record(t, ctx, e)[0]
	second := f.record(t, ctx, e)[0] // a redelivery, a retry, a replay
	require.Equal(t, first.ID, second.ID)
	require.Equal(t, ledger.EffectID("mail.send", "order-1"), first.ID)
	require.Equal(t, ledger.IdempotencyKey(first.ID), first.IdempotencyKey)
	require.Equal(t, ledger.StatusPending, first.Status)

	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"mail.send": &ledger.HTTPExecutor{}}})
	done := f.waitFor(t, first.ID, status(ledger.StatusSucceeded))
	require.Equal(t, `{"ok":true}`, string(done.Response))
	require.Equal(t, idem.HashBytes([]byte(`{"ok":true}`)), done.ResponseHash)

	// Recording again after success still returns the one entry.
	again := f.record(t, ctx, e)[0]
	require.Equal(t, ledger.StatusSucceeded, again.Status)
	require.Equal(t, []string{first.IdempotencyKey}, tg.received())

	list, err := f.ledger.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	require.Len(t, list, 1)
}

func TestRecordingSameIDWithDifferentRequestIsConflict(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	e := ledger.Effect{Type: "payment.capture", BusinessKey: "order-7", Request: map[string]int{"cents": 100}}
	first := f.record(t, ctx, e)[0]

	e.Request = map[string]int{"cents": 999}
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Record(ctx, tx, e)
		require.ErrorIs(t, err, ledger.ErrEffectConflict)
		var conflict *ledger.EffectConflictError
		require.True(t, errors.As(err, &conflict))
		require.Equal(t, first.ID, conflict.EffectID)
		require.Equal(t, first.RequestHash, conflict.Stored)
		require.Equal(t, idem.HashBytes([]byte(`{"cents":999}`)), conflict.Recorded)
		// The transaction stays usable after the conflict.
		_, err = f.ledger.Record(ctx, tx, ledger.Effect{Type: "payment.capture", BusinessKey: "order-8", Request: []byte(`{}`)})
		return err
	})
	require.NoError(t, err)

	got, err := f.ledger.Get(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, first.RequestHash, got.RequestHash)
}

func TestRecordInRolledBackTransactionLeavesNoEffect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	entry, err := f.ledger.Record(ctx, tx, ledger.Effect{Type: "mail.send", BusinessKey: "k", Request: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = f.ledger.Get(ctx, entry.ID)
	require.ErrorIs(t, err, ledger.ErrNotFound)
}

func TestRebuildRecordsSuppressedAndNeverDispatches(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tg := newTarget(t, ok)
	rebuild := idem.WithMode(context.Background(), idem.Rebuild)
	suppressed := f.record(t, rebuild, ledger.Effect{Type: "mail.send", BusinessKey: "old", Target: tg.URL, Request: []byte(`{}`)})[0]
	require.Equal(t, ledger.StatusSuppressed, suppressed.Status)

	f.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"mail.send": &ledger.HTTPExecutor{}}})
	// A live effect recorded after it is dispatched: the dispatcher has run
	// its claims past the suppressed one.
	live := f.record(t, context.Background(), ledger.Effect{Type: "mail.send", BusinessKey: "new", Target: tg.URL, Request: []byte(`{}`)})[0]
	f.waitFor(t, live.ID, status(ledger.StatusSucceeded))

	got, err := f.ledger.Get(context.Background(), suppressed.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSuppressed, got.Status)
	require.Zero(t, got.AttemptCount)
	require.Equal(t, []string{live.IdempotencyKey}, tg.received())
}

func TestForensicCapturesEffectsAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, capture := ledger.WithCapture(idem.WithMode(context.Background(), idem.Forensic))
	e := ledger.Effect{Type: "mail.send", BusinessKey: "k1", Request: map[string]string{"to": "x"}}
	err := pgx.BeginTxFunc(ctx, f.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		for _, eff := range []ledger.Effect{e, e, {Type: "mail.send", BusinessKey: "k2", Request: []byte(`{}`)}} {
			if _, err := f.ledger.Record(ctx, tx, eff); err != nil {
				return err
			}
		}
		e.Request = map[string]string{"to": "y"}
		_, err := f.ledger.Record(ctx, tx, e)
		require.ErrorIs(t, err, ledger.ErrEffectConflict)
		return nil
	})
	require.NoError(t, err)

	got := capture.Effects()
	require.Len(t, got, 2)
	require.Equal(t, ledger.EffectID("mail.send", "k1"), got[0].ID)
	require.Equal(t, ledger.EffectID("mail.send", "k2"), got[1].ID)
	list, err := f.ledger.List(context.Background(), ledger.Filter{})
	require.NoError(t, err)
	require.Empty(t, list)
}

func TestForensicWithoutCaptureFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := idem.WithMode(context.Background(), idem.Forensic)
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Record(ctx, tx, ledger.Effect{Type: "mail.send", BusinessKey: "k", Request: []byte(`{}`)})
		return err
	})
	require.ErrorIs(t, err, ledger.ErrNoCapture)
}

func TestExplicitEffectIDOverridesDerivedID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	got := f.record(t, context.Background(), ledger.Effect{ID: "refund/42", Type: "payment.refund", BusinessKey: "order-42", Request: []byte(`{}`)})[0]
	require.Equal(t, "refund/42", got.ID)
	require.Equal(t, ledger.IdempotencyKey("refund/42"), got.IdempotencyKey)
	require.Len(t, got.IdempotencyKey, 32)
}
