package engine

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/store"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// fixture is an engine on a fresh schema with an accounts table; items
// carry the account their handler updates as Msg.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	eng    *Engine
	update string
}

func newFixture(t *testing.T, handler func(ctx context.Context, tx pgx.Tx, it *idem.Message) error, edit func(*Config)) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	f := &fixture{t: t, pool: pool, tables: tables,
		update: `UPDATE ` + tables.QuotedSchema() + `.accounts SET balance = balance + 1 WHERE id = $1`}
	f.exec(`CREATE TABLE ` + tables.QuotedSchema() + `.accounts (id int PRIMARY KEY, balance int NOT NULL)`)
	f.exec(`INSERT INTO ` + tables.QuotedSchema() + `.accounts SELECT g, 0 FROM generate_series(0, 9) g`)
	if handler == nil {
		handler = f.updateAccount
	}
	cfg := Config{Name: "test", Source: "test", Pool: pool, Tables: tables, Logger: testrun.Logger(), Handler: handler,
		BatchRetries: 3, MaxAttempts: 3, MaxCrashes: 2, CommitTimeout: 10 * time.Second,
		HandlerTimeout: 10 * time.Second, LockTimeout: 50 * time.Millisecond, MaxConcurrency: 4}
	if edit != nil {
		edit(&cfg)
	}
	var err error
	f.eng, err = New(cfg)
	require.NoError(t, err)
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(context.Background(), sql, args...)
	require.NoError(f.t, err)
}

func (f *fixture) balance(account int) int {
	f.t.Helper()
	var b int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT balance FROM `+f.tables.QuotedSchema()+
		`.accounts WHERE id = $1`, account).Scan(&b))
	return b
}

// account is the account a test message updates: its body.
func account(m *idem.Message) int {
	n, _ := strconv.Atoi(string(m.Body))
	return n
}

func (f *fixture) updateAccount(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
	_, err := tx.Exec(ctx, f.update, account(it))
	return err
}

// item is a message that updates account.
func item(id string, account int) *Item {
	return &Item{Message: &idem.Message{ID: id, Hash: idem.HashBytes([]byte(id)), Source: "test", Attempt: 1,
		Body: []byte(strconv.Itoa(account))}}
}

func outcomes(res []Result) []idem.Outcome {
	out := make([]idem.Outcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

// A message whose first write names a row that another batch in flight
// wrote leaves its batch at once instead of waiting for that batch's locks
// (or deadlocking with it); the rest of its batch commits, and the message
// applies once when it runs in a later batch.
func TestMessageThatWouldWaitForAnotherBatchIsPostponed(t *testing.T) {
	t.Parallel()
	holding, release := make(chan struct{}), make(chan struct{})
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if err := f.updateAccount(ctx, tx, it); err != nil {
			return err
		}
		if it.ID == "a" {
			close(holding)
			<-release // batch A holds account 1 until released
		}
		return nil
	}, nil)
	ctx := context.Background()
	doneA := make(chan []Result, 1)
	go func() { doneA <- f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{}) }()
	<-holding
	b1, b2 := item("b1", 1), item("b2", 2)
	started := time.Now()
	res := f.eng.Run(ctx, []*Item{b1, b2}, Queue{})
	require.Equal(t, []idem.Outcome{idem.Postponed, idem.Processed}, outcomes(res))
	require.Less(t, time.Since(started), 5*time.Second, "b1 must not wait for batch A's lock")
	close(release)
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneA))
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(f.eng.Run(ctx, []*Item{b1}, Queue{})))
	require.Equal(t, 2, f.balance(1))
	require.Equal(t, 1, f.balance(2))
}

// A postponed message runs again at the end of its batch: when the batch
// that held its row has committed by then, it applies in this batch, once,
// and its inbox row commits with it (a second delivery is a duplicate).
func TestPostponedMessageRunsAtTheEndOfItsBatchWhenTheRowIsFree(t *testing.T) {
	t.Parallel()
	holding, release, committedA := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if err := f.updateAccount(ctx, tx, it); err != nil {
			return err
		}
		switch it.ID {
		case "a":
			close(holding)
			<-release
		case "b2": // runs after b1 was postponed: let batch A commit first
			close(release)
			<-committedA
		}
		return nil
	}, nil)
	ctx := context.Background()
	doneA := make(chan []Result, 1)
	go func() {
		res := f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{})
		close(committedA)
		doneA <- res
	}()
	<-holding
	b1 := item("b1", 1)
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Processed}, outcomes(f.eng.Run(ctx, []*Item{b1, item("b2", 2)}, Queue{})))
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneA))
	require.Equal(t, []idem.Outcome{idem.Duplicate}, outcomes(f.eng.Run(ctx, []*Item{b1}, Queue{})))
	require.Equal(t, 2, f.balance(1))
	require.Equal(t, 1, f.balance(2))
}

// Without Postpone (ordered sources, ordering keys) the same message waits
// for the other batch's lock and commits after it, in order.
func TestWithoutPostponeAMessageWaitsForTheOtherBatch(t *testing.T) {
	t.Parallel()
	holding, release := make(chan struct{}), make(chan struct{})
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if err := f.updateAccount(ctx, tx, it); err != nil {
			return err
		}
		if it.ID == "a" {
			close(holding)
			<-release
		}
		return nil
	}, func(cfg *Config) { cfg.LockTimeout = 10 * time.Second })
	ctx := context.Background()
	doneA := make(chan []Result, 1)
	go func() { doneA <- f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{Ordered: true}) }()
	<-holding
	doneB := make(chan []Result, 1)
	go func() { doneB <- f.eng.Run(ctx, []*Item{item("b", 1)}, Queue{Ordered: true}) }()
	select {
	case <-doneB:
		t.Fatal("b committed while a held the row")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneA))
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneB))
	require.Equal(t, 2, f.balance(1))
}

// A message that can no longer be postponed writes its row after the other
// batch's lock, and its batch then holds the row too. A third batch must
// find the row held once the first commits: it is postponed, instead of
// waiting on a lock the runtime did not know of, timing out and taking the
// conflict for another process's (which serializes every batch).
func TestARowWrittenAfterAnotherBatchsLockStaysKnownUntilThatBatchEnds(t *testing.T) {
	t.Parallel()
	holdingA, releaseA := make(chan struct{}), make(chan struct{})
	holdingB, releaseB := make(chan struct{}), make(chan struct{})
	var f *fixture
	f = newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if err := f.updateAccount(ctx, tx, it); err != nil {
			return err
		}
		switch it.ID {
		case "a":
			close(holdingA)
			<-releaseA
		case "b":
			close(holdingB)
			<-releaseB
		}
		return nil
	}, func(cfg *Config) { cfg.LockTimeout = 10 * time.Second })
	ctx := context.Background()
	doneA, doneB := make(chan []Result, 1), make(chan []Result, 1)
	go func() { doneA <- f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{}) }()
	<-holdingA
	b := item("b", 1)
	b.postponed = maxPostponements // waits for the row like any other
	go func() { doneB <- f.eng.Run(ctx, []*Item{b}, Queue{}) }()
	require.Eventually(t, func() bool { return f.waitingOnLocks() == 1 }, 5*time.Second, 10*time.Millisecond,
		"b waits for a's lock on account 1")
	close(releaseA)
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneA))
	<-holdingB // b wrote account 1 and holds it

	doneC := make(chan []Result, 1)
	go func() { doneC <- f.eng.Run(ctx, []*Item{item("c", 1)}, Queue{}) }()
	select {
	case res := <-doneC:
		require.Equal(t, []idem.Outcome{idem.Postponed}, outcomes(res))
	case <-time.After(2 * time.Second):
		close(releaseB)
		<-doneC
		t.Fatal("c waited for b's lock on account 1: the row was not known to be held")
	}
	close(releaseB)
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(<-doneB))
	require.Zero(t, f.eng.Counts.Contention.Load())
	require.Equal(t, 2, f.balance(1))
}

// waitingOnLocks is how many of the fixture's backends wait for a lock.
func (f *fixture) waitingOnLocks() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`,
		f.tables.QuotedSchema()+".accounts").Scan(&n))
	return n
}

// A batch split by conflicts in an ordered source never writes a checkpoint
// past a message of a half that did not commit: that message would be
// skipped for good on restart.
func TestSplitOrderedBatchNeverCheckpointsPastAnUnsettledMessage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		if it.Offset == 1 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return nil
	}, func(cfg *Config) { cfg.BatchRetries = 2 })
	var items []*Item
	for i := range 4 {
		it := item(fmt.Sprintf("m%d", i), 0)
		it.Offset, it.HasOffset = int64(i), true
		items = append(items, it)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := f.eng.RunOrdered(ctx, ctx, items, Ordered{RetryBaseDelay: time.Millisecond, RetryMaxDelay: time.Millisecond,
		Checkpoint: func(ctx context.Context, tx pgx.Tx, upTo int64) error {
			return store.AdvanceCheckpoint(ctx, tx, f.tables, "test", "s", upTo)
		}})
	require.Error(t, err, "offset 1 never settles")
	last, ok, err := store.Checkpoint(ctx, f.pool, f.tables, "test", "s")
	require.NoError(t, err)
	if ok {
		require.Less(t, last, int64(1), "the checkpoint passed offset 1, which never committed")
	}
}

// A repair re-runs a processed message once even when the batch holds two
// copies of it.
func TestRerunRunsEachMessageOncePerBatch(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error { runs.Add(1); return nil }, nil)
	ctx := context.Background()
	m := item("m", 0)
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(f.eng.Run(ctx, []*Item{m}, Queue{Ordered: true})))
	repair := (&Ordered{Mode: idem.Repair, Select: func(*idem.Message) bool { return true }}).rules(f.eng, nil)
	res, err := f.eng.runWithoutRetries(ctx, []*Item{item("m", 0), item("m", 0)}, &repair)
	require.NoError(t, err)
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Duplicate}, outcomes(res))
	require.EqualValues(t, 2, runs.Load())
}

// Batches claim with a plain INSERT until one meets a message the inbox
// holds; that batch runs again with ClaimBatch, and so do the next ones for
// a while, because duplicates come in runs.
func TestBatchThatMeetsAClaimedMessageFallsBackToClaimBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	ctx := context.Background()
	require.Equal(t, []idem.Outcome{idem.Processed}, outcomes(f.eng.Run(ctx, []*Item{item("a", 1)}, Queue{Ordered: true})))
	require.Zero(t, f.eng.classicClaims.Load(), "a batch of new messages keeps the plain INSERT")
	conflict := item("a", 1)
	conflict.Hash = idem.HashBytes([]byte("another payload"))
	res := f.eng.Run(ctx, []*Item{item("b", 2), item("a", 1), conflict, item("c", 3)}, Queue{Ordered: true})
	require.Equal(t, []idem.Outcome{idem.Processed, idem.Duplicate, idem.DeadLettered, idem.Processed}, outcomes(res))
	require.EqualValues(t, classicClaimBatches, f.eng.classicClaims.Load(), "the next batches claim with ClaimBatch")
	require.Equal(t, 1, f.balance(1))
}

// A suspect that was running alone each time its worker died is
// dead-lettered as worker_crashed after MaxCrashes deaths, without running;
// a suspect whose starts were all cleared runs normally.
func TestSuspectIsDeadLetteredAfterItsWorkerDiedMaxCrashesTimes(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error { runs.Add(1); return nil }, nil)
	ctx := context.Background()
	poison := item("poison", 0)
	for range f.eng.cfg.MaxCrashes { // starts counted, never cleared: the worker died each time
		_, err := f.eng.markStart(ctx, "test", poison)
		require.NoError(t, err)
	}
	r := f.eng.RunAlone(ctx, item("poison", 0), Queue{Ordered: true})
	require.Equal(t, idem.DeadLettered, r.Outcome)
	require.Equal(t, "worker_crashed", r.Reason)
	require.Zero(t, runs.Load(), "a poison message does not run again")

	healthy := item("healthy", 0)
	healthy.Suspect = true
	require.Equal(t, idem.Processed, f.eng.RunAlone(ctx, healthy, Queue{Ordered: true}).Outcome)
	var rows int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("attempts")).Scan(&rows))
	require.Zero(t, rows, "settled messages leave no attempts rows")
}

// A suspect whose start cannot be counted, the database refusing
// connections, is not handed back at once: the broker would deliver it
// again within milliseconds, a suspect again each time, until its delivery
// limit dead-lettered it with no row. RunAlone tries the mark again, as a
// batch tries its transaction, and runs the message once the database
// answers.
func TestASuspectWaitsForTheDatabaseInsteadOfGoingBackToTheBroker(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.New(t, u.Host)
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Resume) // before the pool closes its connections
	f := newFixture(t, nil, func(c *Config) { c.Pool = pool })

	proxy.Refuse()
	suspect := item("suspect", 1)
	suspect.Suspect = true
	done := make(chan Result, 1)
	go func() { done <- f.eng.RunAlone(context.Background(), suspect, Queue{Ordered: true}) }() // owned: waited for below
	select {
	case r := <-done:
		t.Fatalf("RunAlone handed the suspect back during the outage: %v (%v)", r.Outcome, r.Err)
	case <-time.After(2 * time.Second):
	}
	proxy.Resume()
	select {
	case r := <-done:
		require.Equal(t, idem.Processed, r.Outcome, "%v", r.Err)
	case <-time.After(30 * time.Second):
		t.Fatal("RunAlone did not run the suspect within 30s of the database answering again")
	}
	require.Equal(t, 1, f.balance(1))
}

// A handler error in a batch that commits nothing else is retried from the
// attempts table: the next delivery sees the next attempt number.
func TestFailedAttemptsAreCountedInTheAttemptsTable(t *testing.T) {
	t.Parallel()
	var seen []int
	f := newFixture(t, func(ctx context.Context, tx pgx.Tx, it *idem.Message) error {
		seen = append(seen, it.Attempt)
		return errors.New("transient")
	}, nil)
	ctx := context.Background()
	for range 3 {
		it := item("m", 0)
		it.Returned = true // back from the retry queue
		res := f.eng.Run(ctx, []*Item{it}, Queue{Ordered: true})
		require.Len(t, res, 1)
	}
	require.Equal(t, 3, seen[len(seen)-1], "attempts: %v", seen)
}
