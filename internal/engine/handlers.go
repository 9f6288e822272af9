package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/safetext"
	"github.com/idemkit/idem/internal/sqltext"
)

// runHandlers runs, in batch order, the handler of every item the inbox
// did not hold (and, read-only or rerun, of the others too), and decides
// each item's result. Without savepoints the first failure abandons the
// attempt (errNeedSavepoints); with them it rolls back only its item.
func (b *batch) runHandlers(ctx context.Context, runnable []int, decisions []inbox.Result) error {
	b.runnable, b.decisions = runnable, decisions
	var together []int // with a batch handler: the items it runs at once
	var rerunIDs map[string]bool
	savepoint := false
	for _, i := range runnable {
		it, d := b.items[i], decisions[i]
		if b.stopAt >= 0 && i > b.stopAt || b.keyStopped(i) {
			b.results[i] = Result{Outcome: idem.Held}
			if d.Decision == inbox.NewMessage && b.rules.inbox != inboxLook {
				b.unclaim = append(b.unclaim, it.ID)
			}
			continue
		}
		b.results[i].Inbox = d.Decision
		if d.Decision != inbox.NewMessage {
			b.results[i].StoredHash = d.StoredHash
		}
		rerun := b.rules.inbox == inboxRerun && d.Decision == inbox.Duplicate && !rerunIDs[it.ID]
		if rerun {
			if rerunIDs == nil {
				rerunIDs = map[string]bool{}
			}
			rerunIDs[it.ID] = true // a second copy in the batch is a duplicate of this run
		}
		if d.Decision != inbox.NewMessage && b.rules.inbox != inboxLook && !rerun {
			b.results[i] = notRun(it, d)
			continue
		}
		if !b.plan.savepoints && b.e.cfg.BatchHandler != nil && b.rules.messageContext == nil {
			together = append(together, i)
			continue
		}
		if err := b.runItem(ctx, i, d, &savepoint); err != nil {
			return err
		}
	}
	if err := b.runPostponed(ctx, &savepoint); err != nil {
		return err
	}
	b.holdAfterStop()
	if len(together) > 0 {
		return b.runTogether(ctx, together)
	}
	return nil
}

// runItem runs item i's handler, in a savepoint of its own when the batch
// runs with savepoints; savepoint says whether one was taken before.
func (b *batch) runItem(ctx context.Context, i int, d inbox.Result, savepoint *bool) error {
	if b.plan.savepoints {
		stmt := "SAVEPOINT idem_message"
		if *savepoint {
			stmt = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message"
		}
		sctx, cancel := b.bounded(ctx, b.plan.lockTimeout)
		_, err := b.tx.Exec(sctx, stmt)
		cancel()
		if err != nil {
			return failed(fmt.Errorf("savepoint: %w", err))
		}
		*savepoint = true
	}
	if err := b.runOne(ctx, i, d); err != nil {
		if b.ended {
			b.repairEndedTx(ctx)
		}
		return err
	}
	return nil
}

// runPostponed gives the items postponed in this batch a second try at its
// end: the batch that wrote their row has often committed by then (the
// workers' batches overlap by about half). Those postponed again leave the
// batch; their claims are removed before it commits. Each one left holds
// the acks of every later delivery on its channel (an ack with multiple
// covers everything below it) until a later batch settles it.
func (b *batch) runPostponed(ctx context.Context, savepoint *bool) error {
	var postponed []int
	for _, i := range b.runnable {
		if b.results[i].Outcome == idem.Postponed {
			postponed = append(postponed, i)
		}
	}
	for _, i := range postponed {
		if err := b.runItem(ctx, i, b.decisions[i], savepoint); err != nil {
			return err
		}
	}
	for _, i := range postponed {
		if b.results[i].Outcome == idem.Postponed {
			b.items[i].postponed++
			b.unclaim = append(b.unclaim, b.items[i].ID)
		}
	}
	return nil
}

// notRun is the result of an item the inbox held: a duplicate, or a
// conflict, which is dead-lettered.
func notRun(it *Item, d inbox.Result) Result {
	if d.Decision == inbox.Duplicate {
		return Result{Outcome: idem.Duplicate, Inbox: d.Decision, StoredHash: d.StoredHash}
	}
	return Result{Outcome: idem.DeadLettered, Reason: deadletters.ReasonPayloadConflict, StoredHash: d.StoredHash, Inbox: d.Decision,
		Err: fmt.Errorf("message id reused with payload hash %s, inbox holds %s", it.Hash, d.StoredHash)}
}

// holdAfterStop leaves every item after an in-order stop, and every item
// after a stop of its key, for later, the rejected ones too: they are
// dead-lettered when their turn comes.
func (b *batch) holdAfterStop() {
	if b.stopAt < 0 && len(b.keyStops) == 0 {
		return
	}
	for i := range b.items {
		if b.stopAt >= 0 && i > b.stopAt || b.keyStopped(i) {
			if o := b.results[i].Outcome; o != idem.Held && o != idem.Skipped {
				b.results[i] = Result{Outcome: idem.Held}
			}
		}
	}
}

// stopKey notes that item i, whose key promises order (rules.byKey), is to
// be retried or waits for one that is: its key's later items wait too.
func (b *batch) stopKey(i int) {
	key := b.items[i].Key
	if b.keyStops == nil {
		b.keyStops = map[string]int{}
	}
	if at, ok := b.keyStops[key]; !ok || i < at {
		b.keyStops[key] = i
	}
}

// keyStopped reports whether an earlier item of item i's key was stopped.
func (b *batch) keyStopped(i int) bool {
	at, ok := b.keyStops[b.items[i].Key]
	return ok && at < i
}

// maxPostponements is how many batches a message may leave before it waits
// for the rows it writes like any other.
const maxPostponements = 3

// runOne runs item i's handler and decides its result.
func (b *batch) runOne(ctx context.Context, i int, d inbox.Result) error {
	it := b.items[i]
	b.htx.next(b.rules.postpone && it.postponed < maxPostponements && d.Decision == inbox.NewMessage)
	herr, err := b.call(ctx, i, func(hctx context.Context) error { return b.e.handle(hctx, b.htx, it.Message) })
	if err != nil {
		return err
	}
	if b.htx.postponed {
		// Nothing of it was written: it runs again at the end of the batch
		// (runPostponed), or in a later one.
		b.results[i] = Result{Outcome: idem.Postponed, Inbox: d.Decision}
		return nil
	}
	if herr == nil {
		b.results[i].Outcome = idem.Processed
		b.done[i] = true
		return nil
	}
	if c := b.htx.contention; (c != nil || isContention(herr)) && b.rules.inbox != inboxLook {
		if c == nil {
			c = herr
		}
		return &batchError{err: fmt.Errorf("message %s: %w", shortID(it.ID), c), contention: true, foreign: b.htx.foreign}
	}
	if !b.plan.savepoints {
		return errNeedSavepoints // the failure cannot be undone alone
	}
	sctx, cancel := b.bounded(ctx, b.plan.lockTimeout)
	_, err = b.tx.Exec(sctx, "ROLLBACK TO SAVEPOINT idem_message")
	cancel()
	if err != nil {
		return failed(fmt.Errorf("rollback to savepoint after handler error %v: %w", herr, err))
	}
	if d.Decision == inbox.NewMessage && b.rules.inbox != inboxLook {
		b.unclaim = append(b.unclaim, it.ID)
	}
	r := b.e.classify(it, herr)
	r.Inbox, r.StoredHash = d.Decision, b.results[i].StoredHash
	b.results[i] = r
	if r.Outcome == idem.Retried && b.rules.inOrder {
		b.stopAt = i
	}
	if r.Outcome == idem.Retried && b.rules.byKey {
		b.stopKey(i)
	}
	return nil
}

// handle runs the handler on m and turns a panic into an *idem.PanicError,
// logged with its stack.
func (e *Engine) handle(ctx context.Context, tx pgx.Tx, m *idem.Message) (err error) {
	defer e.recoverPanic(&err, "handler panicked", m.ID)
	return e.cfg.Handler(ctx, tx, m)
}

func (e *Engine) recoverPanic(err *error, what, id string) {
	if v := recover(); v != nil {
		pe := &idem.PanicError{Value: v, Stack: debug.Stack()}
		*err = pe
		e.cfg.Logger.Error(what, "message_id", safetext.ShortID(id), "panic", fmt.Sprint(v), "stack", string(pe.Stack))
	}
}

// call runs one handler (item index, or -1 for the batch handler) under the
// handler deadline and the supervisor's watch, then checks that the
// transaction is still open. It returns the handler's error, or an error
// that ends the attempt: the handler timed out, was abandoned, ended the
// transaction, or its connection is gone.
func (b *batch) call(ctx context.Context, index int, run func(context.Context) error) (herr, err error) {
	hctx := b.handlerCtx // ends with the handler deadline: never the runtime's own
	if index >= 0 {
		hctx = b.ctxs[index]
	}
	start := b.watch.enter(index, b.conn, b, b.expire)
	hc := &b.batchHctx
	if index >= 0 {
		hc = &b.hctxs[index]
	}
	if hc.Context != nil {
		// A second call in this attempt (a postponed message's second
		// try): the first may have left the context with a goroutine.
		hc = new(handlerContext)
	}
	*hc = handlerContext{hctx, start.Add(b.e.cfg.HandlerTimeout)}
	herr = run(hc)
	timedOut, ours := b.watch.leave()
	if !ours {
		b.abandoned = true
		return nil, errAbandoned // the supervisor decided; touch nothing
	}
	b.e.Vitals.moved() // a handler that returned is progress
	b.took = append(b.took, time.Since(start))
	it := &Item{Message: &idem.Message{Attempt: 1}}
	exclude := func(r Result) error { return &excludeError{index: index, result: r} }
	if index >= 0 {
		it = b.items[index]
	}
	conn := b.tx.Conn()
	status := conn.PgConn().TxStatus()
	b.ended = !conn.IsClosed() && (status == 'I' || b.htx.raw && status == 'T' && b.replacedTx(ctx))
	switch {
	case timedOut:
		return nil, exclude(b.e.classify(it, &idem.TimeoutError{Limit: b.e.cfg.HandlerTimeout}))
	case ctx.Err() != nil:
		return nil, failed(fmt.Errorf("batch cancelled in a handler: %w", context.Cause(ctx)))
	case b.htx.violated.Load() || b.ended:
		b.e.cfg.Logger.Error("handler tried to end the batch transaction: nothing of the batch is acked, the message is dead-lettered",
			"message_id", shortID(it.ID), "ended", b.ended, "error", herr)
		return nil, exclude(Result{Outcome: idem.DeadLettered, Reason: deadletters.ReasonHandlerEndedTx,
			Err: fmt.Errorf("%w: %v", idem.ErrTransactionControl, herr)})
	case b.tx.Conn().IsClosed():
		return nil, failed(fmt.Errorf("connection lost in a handler: %v", herr))
	case herr == nil && status == 'E':
		return errAbortedByHandler, nil // the handler swallowed a failed statement
	}
	return herr, nil
}

// classify turns a handler error into a dead letter or a retry.
func (e *Engine) classify(it *Item, herr error) Result {
	if dl, ok := errors.AsType[*idem.DeadLetterError](herr); ok {
		return Result{Outcome: idem.DeadLettered, Reason: dl.Reason, Err: herr}
	}
	if it.Attempt >= e.cfg.MaxAttempts {
		reason := deadletters.ReasonMaxAttempts
		if _, ok := errors.AsType[*idem.TimeoutError](herr); ok {
			reason = deadletters.ReasonHandlerTimeout
		}
		return Result{Outcome: idem.DeadLettered, Reason: reason,
			Err: fmt.Errorf("attempt %d of %d: %w", it.Attempt, e.cfg.MaxAttempts, herr)}
	}
	return Result{Outcome: idem.Retried, Err: herr}
}

func shortID(id string) string { return safetext.ShortID(id) }

// errHandlerDeadline is the cause of a handler context that ran out.
var errHandlerDeadline = errors.New("handler deadline")

// errAbandoned ends an attempt whose handler returned after it was abandoned.
var errAbandoned = errors.New("engine: the handler returned after it was abandoned")

// watch is what the supervisor of an attempt knows about it: which handler
// runs, since when, and whether the attempt was abandoned. The attempt's
// goroutine owns its connection except while a handler runs; the
// supervisor may take it then, and only then (see Engine.abandon). The
// handler stage marks its handlers in and out (enter, leave); the
// supervisor looks at it when a handler may have run too long (overdue).
type watch struct {
	mu        sync.Mutex
	conn      *pgxpool.Conn
	owner     *batch
	inHandler bool
	index     int // the item whose handler runs; -1 for the batch handler
	started   time.Time
	abandoned bool
	// expire ends the handlers' context with errHandlerDeadline. The
	// supervisor calls it, under mu, only while a handler that ran past its
	// deadline is still in the watch; the attempt then ends (see call), so
	// no later handler ever sees the ended context. One cancellable context
	// per attempt costs far less than a timer per handler.
	expire  context.CancelCauseFunc
	expired bool
}

// enter notes that handler index of owner starts now, on conn, with the
// handlers' context that expire ends, and returns when it started.
func (w *watch) enter(index int, conn *pgxpool.Conn, owner *batch, expire context.CancelCauseFunc) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn, w.owner, w.expire = conn, owner, expire
	w.inHandler, w.index, w.started = true, index, time.Now()
	return w.started
}

// leave reports whether the handler that just returned ran out of time,
// and whether the attempt is still the goroutine's to finish. After leave
// the supervisor no longer ends the handlers' context.
func (w *watch) leave() (expired, ours bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inHandler = false
	return w.expired, !w.abandoned
}

// late is a handler the supervisor abandons: its index, its connection
// and its batch.
type late struct {
	index int
	conn  *pgxpool.Conn
	owner *batch
}

// overdue ends the running handler's context once it has run for timeout,
// and abandons the attempt once it has run for timeout+grace (it returns
// the handler to abandon); otherwise it says how long to wait before
// looking again.
func (w *watch) overdue(now time.Time, timeout, grace time.Duration) (wait time.Duration, abandon *late) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.inHandler {
		return timeout, nil
	}
	ran := now.Sub(w.started)
	if ran < timeout {
		return timeout - ran, nil
	}
	if !w.expired && w.expire != nil {
		w.expired = true
		w.expire(errHandlerDeadline)
	}
	if ran < timeout+grace {
		return timeout + grace - ran, nil
	}
	w.abandoned = true
	return 0, &late{index: w.index, conn: w.conn, owner: w.owner}
}

// handlerContext is a handler's context: the attempt's handler context,
// which the supervisor ends with errHandlerDeadline, and the handler's own
// deadline. The handler sees its deadline, and a timeout as
// context.DeadlineExceeded, as with context.WithTimeout; contexts it makes
// with context.WithCancel, WithTimeout or WithDeadline end with
// context.Canceled (and the cause errHandlerDeadline), since they hang off
// the attempt's one cancellable context.
type handlerContext struct {
	context.Context
	deadline time.Time
}

func (c *handlerContext) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *handlerContext) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errHandlerDeadline {
		return context.DeadlineExceeded
	}
	return err
}

// handlerTx is the transaction handlers get. It refuses transaction control
// and remembers that the handler tried, so that the runtime fails the
// message even when the handler swallows the error. It also names the rows
// the handler writes (see writeKeys) and postpones a message whose first
// write names a row another batch in flight wrote.
type handlerTx struct {
	pgx.Tx
	violated atomic.Bool

	b        *batch // whose keys the handler's writes are
	postpone bool   // the current message may be postponed
	wrote    bool   // the current message has written
	// postponed reports that the current message was postponed: every
	// statement it sent after that was refused, so nothing of it was written.
	postponed bool
	// deferredAt is the batch's deferred-write count when the message
	// began: a message that deferred a write has written.
	deferredAt int
	// contention is the last lock conflict one of the message's statements
	// met, however the handler wraps it; foreign reports that it was on a
	// row no other batch of this process wrote: another process holds it.
	contention error
	foreign    bool
	owned      bool // the last write statement's row is this batch's alone
	// raw reports that the current message's handler took the raw
	// connection (Conn), which bypasses the guard. xid is the batch
	// transaction's id, read the first time one of its handlers took it:
	// one round trip per batch, and one after each such handler to compare.
	raw bool
	xid int64
	// root is the batch's own transaction when this one is a handler's
	// savepoint (Begin); nil for the root itself.
	root *handlerTx
}

// top is the batch's own transaction, whose state the guard keeps.
func (t *handlerTx) top() *handlerTx {
	if t.root != nil {
		return t.root
	}
	return t
}

// errPostponed is what a postponed message's statements return.
var errPostponed = errors.New("engine: another batch in flight writes this row; the message runs in a later batch")

// next readies the transaction for the next message's handler.
func (t *handlerTx) next(postpone bool) {
	t.postpone, t.wrote, t.postponed, t.contention, t.raw = postpone, false, false, nil, false
	t.foreign, t.owned = false, false
	if t.b != nil && t.b.deferred != nil {
		t.deferredAt = t.b.deferred.Uses()
	}
}

// deferredSince reports whether the current message deferred a write.
func (t *handlerTx) deferredSince() bool {
	return t.b != nil && t.b.deferred != nil && t.b.deferred.Uses() != t.deferredAt
}

// note remembers a lock conflict among a statement's errors.
func (t *handlerTx) note(err error) error {
	if err != nil && isContention(err) {
		top := t.top()
		top.contention, top.foreign = err, top.owned
	}
	return err
}

// admit lets a statement through, or postpones the message: a write whose
// row another batch in flight wrote, before the message wrote anything.
func (t *handlerTx) admit(sql string, args []any) error {
	t = t.top()
	if t.postponed {
		return errPostponed
	}
	if t.b == nil || !sqltext.IsWrite(sql) {
		return nil
	}
	key := sqltext.RowKey(sql, args)
	mayPostpone := t.postpone && !t.wrote && !t.deferredSince()
	t.owned = t.b.e.keys.take(t.b, key, !mayPostpone)
	if !t.owned && mayPostpone {
		t.postponed = true
		return errPostponed
	}
	t.b.keys = append(t.b.keys, key)
	t.wrote = true
	return nil
}

func (t *handlerTx) refuse(what string) error {
	t.top().violated.Store(true)
	return fmt.Errorf("%w (%s)", idem.ErrTransactionControl, what)
}

func (t *handlerTx) check(sql string) error {
	if word, ok := sqltext.ControlWord(sql); ok {
		return t.refuse(word)
	}
	return nil
}

func (t *handlerTx) Commit(context.Context) error   { return t.refuse("Commit") }
func (t *handlerTx) Rollback(context.Context) error { return t.refuse("Rollback") }

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := t.admit(sql, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.Tx.Exec(ctx, sql, args...)
	return tag, t.note(err)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	if err := t.admit(sql, args); err != nil {
		return nil, err
	}
	rows, err := t.Tx.Query(ctx, sql, args...)
	return rows, t.note(err)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.check(sql); err != nil {
		return errRow{err}
	}
	if err := t.admit(sql, args); err != nil {
		return errRow{err}
	}
	return noteRow{t.Tx.QueryRow(ctx, sql, args...), t}
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := t.check(q.SQL); err != nil {
			return errBatch{err}
		}
		if err := t.admit(q.SQL, q.Arguments); err != nil {
			return errBatch{err}
		}
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// noteRow remembers a lock conflict met by a QueryRow.
type noteRow struct {
	pgx.Row
	t *handlerTx
}

func (r noteRow) Scan(dest ...any) error { return r.t.note(r.Row.Scan(dest...)) }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
