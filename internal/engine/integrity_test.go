package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// logFlusher is a minimal consumer.Defer: it queues INSERTs into log and
// sends them at Flush.
type logFlusher struct {
	mu   sync.Mutex
	sql  string
	msgs []string
}

func (l *logFlusher) Flush(ctx context.Context, tx pgx.Tx) error {
	for _, m := range l.msgs {
		if _, err := tx.Exec(ctx, l.sql, m); err != nil {
			return err
		}
	}
	return nil
}

type logKey struct{}

// a deferred write made before the write that postpones the message is
// flushed with the batch although the message leaves it: it applies twice.
func TestAMessageThatDeferredAWriteIsNeverPostponed(t *testing.T) {
	t.Parallel()
	holding, release := make(chan struct{}), make(chan struct{})
	var f *fixture
	var logSQL string
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if d := idem.DeferredFrom(ctx); d != nil && it.ID != "a" {
			fl := d.Use(logKey{}, func() idem.Flusher { return &logFlusher{sql: logSQL} }).(*logFlusher)
			fl.msgs = append(fl.msgs, it.ID)
		} else if it.ID != "a" {
			if _, err := tx.Exec(ctx, logSQL, it.ID); err != nil {
				return err
			}
		}
		if err := f.updateAccount(ctx, tx, it); err != nil {
			return err
		}
		if it.ID == "a" {
			close(holding)
			<-release
		}
		return nil
	}, nil)
	logSQL = `INSERT INTO ` + f.tables.QuotedSchema() + `.log (msg) VALUES ($1)`
	f.exec(`CREATE TABLE ` + f.tables.QuotedSchema() + `.log (msg text)`)
	ctx := context.Background()
	doneA := make(chan []Result, 1)
	go func() { doneA <- f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{}) }()
	<-holding
	b1, b2 := item("b1", 1), item("b2", 2)
	go func() { time.Sleep(300 * time.Millisecond); close(release) }()
	res := f.eng.Run(ctx, []*Item{b1, b2}, Queue{})
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed}, outcomes(res), "b1 deferred a write: it waits for a's row instead")
	<-doneA
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.QuotedSchema()+`.log WHERE msg = 'b1'`).Scan(&n))
	require.Equal(t, 1, n, "b1's deferred write applied %d times", n)
}

var errPerm = errors.New("permanent")

// a message dead-lettered earlier in a savepoint batch keeps its inbox
// row when a later handler commits early, and is then acked as a duplicate.
func TestEarlyCommitNeverAcksADeadLetteredMessageAsADuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		switch it.ID {
		case "k":
			return &idem.DeadLetterError{Reason: "permanent", Err: errPerm}
		case "j":
			_, err := tx.Conn().Exec(ctx, "COMMIT")
			return err
		}
		return nil
	}, nil)
	ctx := context.Background()
	res := f.eng.Run(ctx, []*Item{item("k", 1), item("j", 2)}, Queue{Ordered: true})
	require.Equal(t, "handler_ended_transaction", res[1].Reason)
	var dl int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("dead_letters")+` WHERE message_id = 'k'`).Scan(&dl))
	require.Equal(t, idem.DeadLettered, res[0].Outcome, "k was never processed")
	require.Equal(t, 1, dl, "k has no dead-letter row")
}

// a split ordered batch whose first half retries a message still runs
// its second half: later messages commit (and settle) before it.
func TestSplitOrderedBatchWaitsForItsRetriedMessage(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var failed bool
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if it.Offset == 1 && !failed {
			return errors.New("transient")
		}
		return nil
	}, func(cfg *Config) { cfg.BatchRetries = 1 })
	var items []*Item
	for i := range 4 {
		it := item(fmt.Sprintf("m%d", i), 0)
		it.Offset, it.HasOffset = int64(i), true
		items = append(items, it)
	}
	var settled []int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := f.eng.RunOrdered(ctx, ctx, items, Ordered{RetryBaseDelay: time.Millisecond, RetryMaxDelay: time.Millisecond,
		BeforeCommit: func(ctx context.Context, tx pgx.Tx, its []*Item, res []Result) error {
			if len(its) == 4 {
				return errors.New("whole batch fails")
			}
			for i, r := range res {
				if its[i].Offset == 1 && r.Outcome == idem.Retried {
					mu.Lock()
					failed = true
					mu.Unlock()
				}
			}
			return nil
		},
		Settled: func(it *Item, r Result) error { settled = append(settled, it.Offset); return nil }})
	require.NoError(t, err)
	require.Equal(t, []int64{0, 1, 2, 3}, settled, "settled out of order")
}

// a cross-process probe batch that ends with an excluded message never
// reports done: probing stays set and batches stay serialized for good.
func TestProbeEndedByAnExcludedMessageProbesAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if it.ID == "slow" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, func(cfg *Config) { cfg.HandlerTimeout = 200 * time.Millisecond; cfg.MaxConcurrency = 1 })
	g := f.eng.gov
	g.mu.Lock()
	g.serialUntil = time.Now().Add(-time.Millisecond) // serialized, probe due
	g.mu.Unlock()
	ctx := context.Background()
	res := f.eng.Run(ctx, []*Item{keyed("slow", "slow", 1), keyed("ok", "ok", 2)}, Queue{Ordered: true}) // two keys: ok does not wait for slow
	require.Equal(t, []idem.Outcome{idem.Retried, idem.Processed}, outcomes(res))
	for i := range 5 {
		f.eng.Run(ctx, []*Item{item(fmt.Sprintf("later%d", i), 3)}, Queue{Ordered: true})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	require.False(t, g.probing, "probe never reported")
	require.True(t, g.serialUntil.IsZero() || time.Until(g.serialUntil) > 0, "serialized with no probe to come")
}

// a handler that commits and reopens the transaction through tx.Conn()
// ("COMMIT; BEGIN") passes the TxStatus check; when the batch then fails
// and reruns, every message after it finds its claim committed and is acked
// as a duplicate without having run.
func TestCommitAndBeginThroughTheRawConnectionIsCaught(t *testing.T) {
	t.Parallel()
	var cFailed bool
	var mu sync.Mutex
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		switch it.ID {
		case "j":
			_, err := tx.Conn().Exec(ctx, "COMMIT; BEGIN")
			return err
		case "k":
			mu.Lock()
			defer mu.Unlock()
			if !cFailed {
				cFailed = true
				return errors.New("transient, once")
			}
		}
		return f.updateAccount(ctx, tx, it)
	}, nil)
	ctx := context.Background()
	res := f.eng.Run(ctx, []*Item{item("j", 1), item("k", 2), item("m", 3)}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.DeadLettered, idem.Processed, idem.Processed}, outcomes(res))
	require.Equal(t, "handler_ended_transaction", res[0].Reason)
	require.Equal(t, 1, f.balance(2), "k's effect")
	require.Equal(t, 1, f.balance(3), "m's effect")
}

// The batch's transaction id is read once, when a first handler takes the
// raw connection: handlers that use it harmlessly pass, and a later one
// in the same batch that commits and reopens the transaction is caught.
// Its early commit took the earlier messages with it: they applied once and
// are acked as duplicates when the batch runs again without it.
func TestRawConnectionUseIsCheckedForEveryHandlerOfTheBatch(t *testing.T) {
	t.Parallel()
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		switch it.ID {
		case "raw-1", "raw-2":
			_, err := tx.Conn().Exec(ctx, f.update, account(it))
			return err
		case "j":
			if _, err := tx.Conn().Exec(ctx, "COMMIT; BEGIN"); err != nil {
				return err
			}
		}
		return f.updateAccount(ctx, tx, it)
	}, nil)
	res := f.eng.Run(context.Background(), []*Item{item("raw-1", 1), item("raw-2", 2), item("j", 3), item("m", 4)}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Duplicate, idem.Duplicate, idem.DeadLettered, idem.Processed}, outcomes(res))
	require.Equal(t, "handler_ended_transaction", res[2].Reason)
	for account, want := range map[int]int{1: 1, 2: 1, 3: 0, 4: 1} {
		require.Equal(t, want, f.balance(account), "account %d", account)
	}
}

// a batch handler that commits early through tx.Conn() before writing
// marks every message done; their claims stay, the rerun acks them all as
// duplicates, nothing is dead-lettered and no write happened.
func TestBatchHandlerThatCommitsEarlyAcksNothingUnprocessed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	f.eng.SetBatchHandler(func(ctx context.Context, tx pgx.Tx, its []*idem.Message) error {
		if _, err := tx.Conn().Exec(ctx, "COMMIT"); err != nil {
			return err
		}
		return errors.New("failed after the early commit, before writing")
	})
	ctx := context.Background()
	res := f.eng.Run(ctx, []*Item{item("a", 1), item("b", 2)}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed}, outcomes(res), "message by message after the repair")
	require.Equal(t, [2]int{1, 1}, [2]int{f.balance(1), f.balance(2)}, "a and b each applied once")
}

// in order, an item excluded for a timeout defers the items before it too.
func TestExcludedRetryDefersOnlyTheMessagesAfterIt(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[string]int{}
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		mu.Lock()
		runs[it.ID]++
		n := runs[it.ID]
		mu.Unlock()
		if it.ID == "m2" && n == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, func(cfg *Config) { cfg.HandlerTimeout = 200 * time.Millisecond })
	var items []*Item
	for i := range 4 {
		it := item(fmt.Sprintf("m%d", i), 0)
		it.Offset, it.HasOffset = int64(i), true
		items = append(items, it)
	}
	inOrder := (&Ordered{}).rules(f.eng, nil)
	res := f.eng.run(context.Background(), items, &inOrder, make([]Result, len(items)), false)
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed, idem.Retried, idem.Held}, outcomes(res), "runs %v", runs)
}

// sentSQL records the SQL a pool's connections send.
type sentSQL struct {
	mu  sync.Mutex
	all []string
}

func (s *sentSQL) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.all = append(s.all, d.SQL)
	s.mu.Unlock()
	return ctx
}

func (s *sentSQL) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch handler that took the raw connection and then ran past its
// deadline timed out; it did not end the transaction. The check that tells
// the two apart must not run on the expired handler context, or it would
// take the timeout for an early commit and "repair" claims that were never
// committed: a ROLLBACK and a DELETE of inbox rows in autocommit, which
// could remove a row another worker had just committed.
func TestBatchHandlerThatTimesOutWithTheRawConnectionIsNotTakenForAnEndedTransaction(t *testing.T) {
	t.Parallel()
	trace := &sentSQL{}
	var f *fixture
	f = newFixture(t, nil, func(cfg *Config) {
		pc := cfg.Pool.Config()
		pc.ConnConfig.Tracer = trace
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		cfg.Pool = pool
		cfg.HandlerTimeout = 300 * time.Millisecond
	})
	var first atomic.Bool
	f.eng.SetBatchHandler(func(ctx context.Context, tx pgx.Tx, its []*idem.Message) error {
		if first.CompareAndSwap(false, true) {
			_ = tx.Conn() // raw access, as for CopyFrom
			<-ctx.Done()
			return ctx.Err()
		}
		for _, it := range its {
			if err := f.updateAccount(ctx, tx, it); err != nil {
				return err
			}
		}
		return nil
	})
	res := f.eng.Run(context.Background(), []*Item{item("a", 1), item("b", 2)}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed}, outcomes(res))
	require.Equal(t, [2]int{1, 1}, [2]int{f.balance(1), f.balance(2)})
	trace.mu.Lock()
	defer trace.mu.Unlock()
	for _, sql := range trace.all {
		require.NotContains(t, strings.ToUpper(sql), "DELETE FROM", "no repair of claims after a timeout: %s", sql)
	}
}

// A BeforeCommit that returns a Stop error ends RunOrdered at once: the
// transaction rolls back, and the batch is neither retried nor split.
func TestStopFromBeforeCommitEndsTheRunWithoutRetries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error { return nil }, nil)
	var items []*Item
	for i := range 4 {
		it := item(fmt.Sprintf("m%d", i), 0)
		it.Offset, it.HasOffset = int64(i), true
		items = append(items, it)
	}
	errRefused := errors.New("refused")
	var calls atomic.Int32
	ctx := context.Background()
	err := f.eng.RunOrdered(ctx, ctx, items, Ordered{RetryBaseDelay: time.Millisecond, RetryMaxDelay: time.Millisecond,
		BeforeCommit: func(ctx context.Context, tx pgx.Tx, its []*Item, res []Result) error {
			calls.Add(1)
			return Stop(errRefused)
		}})
	require.ErrorIs(t, err, errRefused)
	require.EqualValues(t, 1, calls.Load(), "the stopped batch was tried again")
	_, _, failing := f.eng.Vitals.Failing(0)
	require.False(t, failing, "a stop is the source's decision, not a failing database")
	var claimed int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("inbox")).Scan(&claimed))
	require.Zero(t, claimed, "the stopped transaction committed")
}

// A batch transaction runs at READ COMMITTED whatever the session's
// default: its claims, and the statements after them, see what the
// transactions they waited for committed.
func TestBatchTransactionsAreReadCommittedWhateverTheSessionDefault(t *testing.T) {
	t.Parallel()
	var level string
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		return tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&level)
	}, func(cfg *Config) {
		pc := cfg.Pool.Config().Copy()
		pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		var def string
		require.NoError(t, pool.QueryRow(context.Background(), "SHOW default_transaction_isolation").Scan(&def))
		require.Equal(t, "repeatable read", def)
		cfg.Pool = pool
	})
	res := f.eng.Run(context.Background(), []*Item{item("a", 1)}, Queue{})
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(res))
	require.Equal(t, "read committed", level)
}
