package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// setup returns a pool, an Inbox on a fresh schema, and its tables.
func setup(t *testing.T) (*pgxpool.Pool, *inbox.Inbox, idem.Tables) {
	t.Helper()
	pool, tables := testdb.Schema(t)
	ib, err := inbox.New(inbox.Config{Tables: tables})
	require.NoError(t, err)
	return pool, ib, tables
}

func hash(s string) idem.Hash { return idem.HashBytes([]byte(s)) }

// claimCommitted claims c in a transaction of its own and commits it.
func claimCommitted(t *testing.T, pool *pgxpool.Pool, ib *inbox.Inbox, c inbox.Claim) inbox.Result {
	t.Helper()
	var res inbox.Result
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		var err error
		res, err = ib.Claim(t.Context(), tx, c)
		return err
	})
	require.NoError(t, err)
	return res
}

func TestClaimIsNewThenDuplicateThenConflictWithStoredHash(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	off := int64(42)
	c := inbox.Claim{Consumer: "billing", MessageID: "m-1", PayloadHash: hash("a"), BusinessKey: "order-7", Source: "orders", StreamOffset: &off}

	require.Equal(t, inbox.Result{Decision: inbox.NewMessage, StoredHash: hash("a")}, claimCommitted(t, pool, ib, c))
	require.Equal(t, inbox.Result{Decision: inbox.Duplicate, StoredHash: hash("a")}, claimCommitted(t, pool, ib, c))

	c.PayloadHash = hash("b")
	require.Equal(t, inbox.Result{Decision: inbox.Conflict, StoredHash: hash("a")}, claimCommitted(t, pool, ib, c))

	// The id is scoped by consumer.
	c.Consumer = "shipping"
	require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, c).Decision)

	rec, err := ib.Lookup(t.Context(), pool, "billing", "m-1")
	require.NoError(t, err)
	require.Equal(t, hash("a"), rec.PayloadHash, "a conflict never overwrites the stored hash")
	require.Equal(t, "order-7", rec.BusinessKey)
	require.Equal(t, "orders", rec.Source)
	require.Equal(t, &off, rec.StreamOffset)
}

func TestClaimTwiceInOneTransactionIsDuplicate(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	c := inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: hash("a")}
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		r, err := ib.Claim(t.Context(), tx, c)
		require.NoError(t, err)
		require.Equal(t, inbox.NewMessage, r.Decision)
		r, err = ib.Claim(t.Context(), tx, c)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, r.Decision)
		return nil
	})
	require.NoError(t, err)
}

func TestConcurrentClaimsOfOneIDYieldExactlyOneNew(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	const n = 50
	c := inbox.Claim{Consumer: "c", MessageID: "same", PayloadHash: hash("p")}

	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]inbox.Result, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
				var err error
				results[i], err = ib.Claim(t.Context(), tx, c)
				return err
			})
		})
	}
	close(start)
	wg.Wait()

	count := map[inbox.Decision]int{}
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, hash("p"), results[i].StoredHash)
		count[results[i].Decision]++
	}
	require.Equal(t, map[inbox.Decision]int{inbox.NewMessage: 1, inbox.Duplicate: n - 1}, count)
}

// TestClaimWaitingOnConcurrentClaimDecidesAfterItEnds drives the case the
// statement snapshot cannot see: a claim blocked on another transaction's
// uncommitted row must return Duplicate or Conflict when that transaction
// commits, and NewMessage when it rolls back.
func TestClaimWaitingOnConcurrentClaimDecidesAfterItEnds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		firstHash idem.Hash
		commit    bool
		want      inbox.Result
	}{
		{"commit same hash", hash("a"), true, inbox.Result{Decision: inbox.Duplicate, StoredHash: hash("a")}},
		{"commit other hash", hash("b"), true, inbox.Result{Decision: inbox.Conflict, StoredHash: hash("b")}},
		{"rollback", hash("b"), false, inbox.Result{Decision: inbox.NewMessage, StoredHash: hash("a")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, ib, _ := setup(t)
			ctx := t.Context()
			first, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer first.Rollback(context.Background()) //nolint:errcheck // no-op after commit
			r, err := ib.Claim(ctx, first, inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: tc.firstHash})
			require.NoError(t, err)
			require.Equal(t, inbox.NewMessage, r.Decision)

			second, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer second.Rollback(context.Background()) //nolint:errcheck // no-op after commit
			pid := second.Conn().PgConn().PID()
			type outcome struct {
				res inbox.Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := ib.Claim(ctx, second, inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: hash("a")})
				done <- outcome{res, err}
			}()
			waitForLockWait(t, pool, pid)

			if tc.commit {
				require.NoError(t, first.Commit(ctx))
			} else {
				require.NoError(t, first.Rollback(ctx))
			}
			got := <-done
			require.NoError(t, got.err)
			require.Equal(t, tc.want, got.res)
			require.NoError(t, second.Commit(ctx))
		})
	}
}

// waitForLockWait polls until backend pid waits for a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		err := pool.QueryRow(t.Context(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		require.NoError(t, err)
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited for the concurrent claim", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestClaimInRolledBackTransactionLeavesNoTrace(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	c := inbox.Claim{Consumer: "c", MessageID: "m", PayloadHash: hash("a")}

	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	r, err := ib.Claim(t.Context(), tx, c)
	require.NoError(t, err)
	require.Equal(t, inbox.NewMessage, r.Decision)
	require.NoError(t, tx.Rollback(t.Context()))

	_, err = ib.Lookup(t.Context(), pool, "c", "m")
	require.ErrorIs(t, err, inbox.ErrNotFound)
	require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, c).Decision)
}

func TestClaimBatchAgreesWithSingleClaims(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	ctx := t.Context()
	off := int64(7)
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "seen", PayloadHash: hash("a")})
	claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "reused", PayloadHash: hash("a")})

	batch := []inbox.Claim{
		{Consumer: "c", MessageID: "fresh", PayloadHash: hash("a"), Source: "q", StreamOffset: &off, BusinessKey: "k"},
		{Consumer: "c", MessageID: "seen", PayloadHash: hash("a")},
		{Consumer: "c", MessageID: "reused", PayloadHash: hash("b")},
		{Consumer: "c", MessageID: "fresh", PayloadHash: hash("a")},  // repeated in the batch, same payload
		{Consumer: "c", MessageID: "fresh", PayloadHash: hash("x")},  // repeated in the batch, other payload
		{Consumer: "c", MessageID: "reused", PayloadHash: hash("a")}, // repeated conflict, now matching the table
		{Consumer: "other", MessageID: "seen", PayloadHash: hash("z")},
		{Consumer: "c", MessageID: "another", PayloadHash: hash("b")},
	}
	want := []inbox.Result{
		{Decision: inbox.NewMessage, StoredHash: hash("a")},
		{Decision: inbox.Duplicate, StoredHash: hash("a")},
		{Decision: inbox.Conflict, StoredHash: hash("a")},
		{Decision: inbox.Duplicate, StoredHash: hash("a")},
		{Decision: inbox.Conflict, StoredHash: hash("a")},
		{Decision: inbox.Duplicate, StoredHash: hash("a")},
		{Decision: inbox.NewMessage, StoredHash: hash("z")},
		{Decision: inbox.NewMessage, StoredHash: hash("b")},
	}

	// One claim after another, in a transaction that is rolled back.
	single := make([]inbox.Result, len(batch))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for i, c := range batch {
		single[i], err = ib.Claim(ctx, tx, c)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, want, single)

	// The same claims as one batch, committed.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := ib.ClaimBatch(ctx, tx, batch)
		require.NoError(t, err)
		require.Equal(t, want, got)
		return nil
	})
	require.NoError(t, err)

	rec, err := ib.Lookup(ctx, pool, "c", "fresh")
	require.NoError(t, err)
	require.Equal(t, inbox.Record{Consumer: "c", MessageID: "fresh", PayloadHash: hash("a"), BusinessKey: "k",
		Source: "q", StreamOffset: &off, ReceivedAt: rec.ReceivedAt}, rec)
	rec, err = ib.Lookup(ctx, pool, "c", "another")
	require.NoError(t, err)
	require.Nil(t, rec.StreamOffset)
	require.Empty(t, rec.BusinessKey)

	// Claiming the batch again: every first occurrence is now in the table.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := ib.ClaimBatch(ctx, tx, batch)
		require.NoError(t, err)
		for i, r := range got {
			require.NotEqual(t, inbox.NewMessage, r.Decision, "claim %d", i)
		}
		return nil
	})
	require.NoError(t, err)
}

func TestClaimBatchOfNothingSendsNothing(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		got, err := ib.ClaimBatch(t.Context(), tx, nil)
		require.NoError(t, err)
		require.Empty(t, got)
		return nil
	})
	require.NoError(t, err)
}

func TestConcurrentOverlappingBatchesClaimEachIDOnce(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	const workers, ids = 8, 60
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		news  = map[string]int{}
		start = make(chan struct{})
		errs  = make([]error, workers)
	)
	for w := range workers {
		wg.Go(func() {
			// Each worker claims every id, in its own order.
			batch := make([]inbox.Claim, ids)
			for i := range ids {
				id := fmt.Sprintf("m-%02d", (i*7+w*13)%ids)
				batch[i] = inbox.Claim{Consumer: "c", MessageID: id, PayloadHash: hash(id)}
			}
			<-start
			errs[w] = pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
				got, err := ib.ClaimBatch(t.Context(), tx, batch)
				if err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				for i, r := range got {
					if r.Decision == inbox.NewMessage {
						news[batch[i].MessageID]++
					} else if r.Decision != inbox.Duplicate {
						return fmt.Errorf("claim %s: %v", batch[i].MessageID, r.Decision)
					}
				}
				return nil
			})
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "overlapping batches must neither fail nor deadlock")
	}
	require.Len(t, news, ids)
	for id, n := range news {
		require.Equal(t, 1, n, id)
	}
}

func TestUnclaimAfterRollbackToSavepointReleasesOnlyThatMessage(t *testing.T) {
	t.Parallel()
	pool, ib, tables := setup(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "CREATE TABLE "+tables.Table("effects")+" (message_id text PRIMARY KEY)")
	require.NoError(t, err)
	batch := []inbox.Claim{
		{Consumer: "c", MessageID: "ok-1", PayloadHash: hash("1")},
		{Consumer: "c", MessageID: "fails", PayloadHash: hash("2")},
		{Consumer: "c", MessageID: "ok-2", PayloadHash: hash("3")},
	}

	// What the consumer runtime does: claim all, then a savepoint per message.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := ib.ClaimBatch(ctx, tx, batch)
		require.NoError(t, err)
		for i, c := range batch {
			require.Equal(t, inbox.NewMessage, res[i].Decision)
			_, err := tx.Exec(ctx, "SAVEPOINT msg")
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "INSERT INTO "+tables.Table("effects")+" VALUES ($1)", c.MessageID)
			require.NoError(t, err)
			if c.MessageID == "fails" {
				_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT msg")
				require.NoError(t, err)
				require.NoError(t, ib.Unclaim(ctx, tx, c.Consumer, c.MessageID))
			}
			_, err = tx.Exec(ctx, "RELEASE SAVEPOINT msg")
			require.NoError(t, err)
		}
		return nil
	})
	require.NoError(t, err)

	var effects int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Table("effects")).Scan(&effects))
	require.Equal(t, 2, effects)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := ib.ClaimBatch(ctx, tx, batch)
		require.NoError(t, err)
		require.Equal(t, []inbox.Decision{inbox.Duplicate, inbox.NewMessage, inbox.Duplicate},
			[]inbox.Decision{res[0].Decision, res[1].Decision, res[2].Decision})
		return nil
	})
	require.NoError(t, err)
}

func TestUnclaimNeverDeletesAnEarlierTransactionsClaim(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	ctx := t.Context()
	c := inbox.Claim{Consumer: "c", MessageID: "done", PayloadHash: hash("a")}
	claimCommitted(t, pool, ib, c)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := ib.Claim(ctx, tx, c)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, r.Decision)
		require.ErrorIs(t, ib.Unclaim(ctx, tx, "c", "done"), inbox.ErrNotClaimed)
		require.ErrorIs(t, ib.Unclaim(ctx, tx, "c", "never-claimed"), inbox.ErrNotClaimed)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, c).Decision)
}

func TestUnclaimBatchDeletesOnlyThisTransactionsClaims(t *testing.T) {
	t.Parallel()
	pool, ib, _ := setup(t)
	ctx := t.Context()
	done := inbox.Claim{Consumer: "c", MessageID: "done", PayloadHash: hash("a")}
	claimCommitted(t, pool, ib, done)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ib.ClaimBatch(ctx, tx, []inbox.Claim{done,
			{Consumer: "c", MessageID: "new-1", PayloadHash: hash("b")},
			{Consumer: "c", MessageID: "new-2", PayloadHash: hash("c")}})
		require.NoError(t, err)
		n, err := ib.UnclaimBatch(ctx, tx, "c", []string{"done", "new-1", "new-2", "never-claimed"})
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "only the two rows this transaction inserted")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, claimCommitted(t, pool, ib, done).Decision, "an earlier commit stays")
	require.Equal(t, inbox.NewMessage, claimCommitted(t, pool, ib, inbox.Claim{Consumer: "c", MessageID: "new-1", PayloadHash: hash("b")}).Decision)
}

func TestInvalidClaimsAreRejectedBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	pool, _, tables := setup(t)
	ctx := t.Context()
	ib, err := inbox.New(inbox.Config{Tables: tables, MaxIDBytes: 8})
	require.NoError(t, err)
	valid := inbox.Claim{Consumer: "c", MessageID: "ok", PayloadHash: hash("a")}
	with := func(f func(*inbox.Claim)) inbox.Claim { c := valid; f(&c); return c }

	for _, tc := range []struct {
		name  string
		claim inbox.Claim
		field string
		want  error
	}{
		{"empty consumer", with(func(c *inbox.Claim) { c.Consumer = "" }), "Consumer", inbox.ErrEmptyConsumer},
		{"consumer with NUL", with(func(c *inbox.Claim) { c.Consumer = "a\x00b" }), "Consumer", inbox.ErrInvalidConsumer},
		{"consumer too long", with(func(c *inbox.Claim) { c.Consumer = "123456789" }), "Consumer", inbox.ErrInvalidConsumer},
		{"empty id", with(func(c *inbox.Claim) { c.MessageID = "" }), "MessageID", inbox.ErrEmptyMessageID},
		{"id too long", with(func(c *inbox.Claim) { c.MessageID = "123456789" }), "MessageID", inbox.ErrMessageIDTooLong},
		{"id of 9 bytes in 3 runes", with(func(c *inbox.Claim) { c.MessageID = "€€€" }), "MessageID", inbox.ErrMessageIDTooLong},
		{"id with NUL", with(func(c *inbox.Claim) { c.MessageID = "a\x00" }), "MessageID", inbox.ErrInvalidMessageID},
		{"id not UTF-8", with(func(c *inbox.Claim) { c.MessageID = "a\xff" }), "MessageID", inbox.ErrInvalidMessageID},
		{"zero hash", with(func(c *inbox.Claim) { c.PayloadHash = idem.Hash{} }), "PayloadHash", inbox.ErrZeroHash},
		{"business key not UTF-8", with(func(c *inbox.Claim) { c.BusinessKey = "\xc3" }), "BusinessKey", inbox.ErrInvalidField},
		{"source with NUL", with(func(c *inbox.Claim) { c.Source = "\x00" }), "Source", inbox.ErrInvalidField},
		{"source too long", with(func(c *inbox.Claim) { c.Source = "123456789" }), "Source", inbox.ErrInvalidField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := ib.Claim(ctx, tx, tc.claim)
				require.ErrorIs(t, err, tc.want)
				var ve *inbox.ValidationError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, tc.field, ve.Field)
				require.Equal(t, 0, ve.Index)

				_, err = ib.ClaimBatch(ctx, tx, []inbox.Claim{valid, valid, tc.claim})
				require.ErrorIs(t, err, tc.want)
				require.ErrorAs(t, err, &ve)
				require.Equal(t, 2, ve.Index)

				// Nothing was sent: the transaction is usable and holds no claim.
				_, err = ib.Lookup(ctx, tx, "c", "ok")
				require.ErrorIs(t, err, inbox.ErrNotFound)
				return nil
			})
			require.NoError(t, err)
		})
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.ErrorIs(t, ib.Unclaim(ctx, tx, "", "x"), inbox.ErrEmptyConsumer)
		require.ErrorIs(t, ib.Unclaim(ctx, tx, "c", ""), inbox.ErrEmptyMessageID)
		return nil
	})
	require.NoError(t, err)
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []inbox.Config{
		{MaxIDBytes: -1},
		{MaxIDBytes: 4096},
		{Tables: idem.Tables{Schema: "a\x00b"}},
	} {
		_, err := inbox.New(cfg)
		require.Error(t, err, "%+v", cfg)
	}
	_, err := inbox.New(inbox.Config{})
	require.NoError(t, err)
}

func TestDecisionString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "new", inbox.NewMessage.String())
	require.Equal(t, "duplicate", inbox.Duplicate.String())
	require.Equal(t, "conflict", inbox.Conflict.String())
	require.Equal(t, "Decision(0)", inbox.Decision(0).String())
}
