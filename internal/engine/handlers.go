package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/inbox"
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
		if b.stopAt >= 0 && i > b.stopAt {
			b.results[i] = Result{Outcome: Deferred}
			if d.Decision == inbox.NewMessage && !b.o.ReadOnly {
				b.unclaim = append(b.unclaim, it.ID)
			}
			continue
		}
		b.results[i].Inbox = d.Decision
		if d.Decision != inbox.NewMessage {
			b.results[i].StoredHash = d.StoredHash
		}
		rerun := b.o.Rerun && d.Decision == inbox.Duplicate && !rerunIDs[it.ID]
		if rerun {
			if rerunIDs == nil {
				rerunIDs = map[string]bool{}
			}
			rerunIDs[it.ID] = true // a second copy in the batch is a duplicate of this run
		}
		if d.Decision != inbox.NewMessage && !b.o.ReadOnly && !rerun {
			b.results[i] = notRun(it, d)
			continue
		}
		if !b.p.savepoints && b.e.cfg.BatchHandler != nil && b.o.MessageContext == nil {
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
	b.deferAfterStop()
	if len(together) > 0 {
		return b.runTogether(ctx, together)
	}
	return nil
}

// runItem runs item i's handler, in a savepoint of its own when the batch
// runs with savepoints; savepoint says whether one was taken before.
func (b *batch) runItem(ctx context.Context, i int, d inbox.Result, savepoint *bool) error {
	if b.p.savepoints {
		stmt := "SAVEPOINT idem_message"
		if *savepoint {
			stmt = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message"
		}
		sctx, cancel := b.bounded(ctx, b.p.lockTimeout)
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
		if b.results[i].Outcome == Postponed {
			postponed = append(postponed, i)
		}
	}
	for _, i := range postponed {
		if err := b.runItem(ctx, i, b.decisions[i], savepoint); err != nil {
			return err
		}
	}
	for _, i := range postponed {
		if b.results[i].Outcome == Postponed {
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
		return Result{Outcome: Duplicate, Inbox: d.Decision, StoredHash: d.StoredHash}
	}
	return Result{Outcome: DeadLettered, Reason: deadletters.ReasonPayloadConflict, StoredHash: d.StoredHash, Inbox: d.Decision,
		Err: fmt.Errorf("message id reused with payload hash %s, inbox holds %s", it.Hash, d.StoredHash)}
}

// deferAfterStop leaves every item after an in-order stop for later, the
// rejected ones too: they are dead-lettered when their turn comes.
func (b *batch) deferAfterStop() {
	if b.stopAt < 0 {
		return
	}
	for i := b.stopAt + 1; i < len(b.items); i++ {
		if o := b.results[i].Outcome; o != Deferred && o != Skipped {
			b.results[i] = Result{Outcome: Deferred}
		}
	}
}

// maxPostponements is how many batches a message may leave before it waits
// for the rows it writes like any other.
const maxPostponements = 3

// runOne runs item i's handler and decides its result.
func (b *batch) runOne(ctx context.Context, i int, d inbox.Result) error {
	it := b.items[i]
	b.htx.next(b.o.Postpone && it.postponed < maxPostponements && d.Decision == inbox.NewMessage)
	herr, err := b.call(ctx, i, func(hctx context.Context) error { return b.e.cfg.Handler(hctx, b.htx, it) })
	if err != nil {
		return err
	}
	if b.htx.postponed {
		// Nothing of it was written: it runs again at the end of the batch
		// (runPostponed), or in a later one.
		b.results[i] = Result{Outcome: Postponed, Inbox: d.Decision}
		return nil
	}
	if herr == nil {
		b.results[i].Outcome = Processed
		b.done[i] = true
		return nil
	}
	if c := b.htx.contention; (c != nil || isContention(herr)) && !b.o.ReadOnly {
		if c == nil {
			c = herr
		}
		return &batchError{err: fmt.Errorf("message %s: %w", shortID(it.ID), c), contention: true, foreign: b.htx.foreign}
	}
	if !b.p.savepoints {
		return errNeedSavepoints // the failure cannot be undone alone
	}
	sctx, cancel := b.bounded(ctx, b.p.lockTimeout)
	_, err = b.tx.Exec(sctx, "ROLLBACK TO SAVEPOINT idem_message")
	cancel()
	if err != nil {
		return failed(fmt.Errorf("rollback to savepoint after handler error %v: %w", herr, err))
	}
	if d.Decision == inbox.NewMessage && !b.o.ReadOnly {
		b.unclaim = append(b.unclaim, it.ID)
	}
	r := b.e.classify(it, herr)
	r.Inbox, r.StoredHash = d.Decision, b.results[i].StoredHash
	b.results[i] = r
	if r.Outcome == Retry && b.o.InOrder {
		b.stopAt = i
	}
	return nil
}

// runTogether runs the batch handler over the items it takes at once. If
// it fails, the batch runs again item by item, a savepoint each, so that
// each failure is attributed to its item.
func (b *batch) runTogether(ctx context.Context, together []int) error {
	its := make([]*Item, len(together))
	for k, i := range together {
		its[k] = b.items[i]
	}
	herr, err := b.call(ctx, -1, func(hctx context.Context) error { return b.e.cfg.BatchHandler(hctx, b.htx, its) })
	var ex *excludeError
	switch {
	case errors.As(err, &ex):
		if b.ended {
			b.repairEndedTx(ctx) // nothing of the batch handler can be trusted
		}
		return errNeedSavepoints // message by message, to find the culprit
	case err != nil:
		return err
	case herr == nil:
		for _, i := range together {
			b.results[i].Outcome = Processed
		}
		return nil
	case isContention(herr):
		return &batchError{err: fmt.Errorf("batch handler: %w", herr), contention: true}
	default:
		return errNeedSavepoints
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
	start := b.watch.enter(index)
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
		return nil, errAbandoned // the supervisor decided; touch nothing
	}
	b.e.Vitals.moved()
	b.e.tel.processTime(ctx, time.Since(start))
	exclude := func(r Result) error {
		if index < 0 {
			return &excludeError{index: -1, result: r}
		}
		return &excludeError{index: index, result: r}
	}
	var it *Item
	if index >= 0 {
		it = b.items[index]
	} else {
		it = &Item{Attempt: 1}
	}
	conn := b.tx.Conn()
	status := conn.PgConn().TxStatus()
	b.ended = !conn.IsClosed() && (status == 'I' || b.replacedTx(ctx, status))
	switch {
	case timedOut:
		return nil, exclude(b.e.classify(it, &TimeoutError{Limit: b.e.cfg.HandlerTimeout}))
	case ctx.Err() != nil:
		return nil, failed(fmt.Errorf("batch cancelled in a handler: %w", context.Cause(ctx)))
	case b.htx.violated.Load() || b.ended:
		b.e.cfg.Logger.Error("handler tried to end the batch transaction: nothing of the batch is acked, the message is dead-lettered",
			"message_id", shortID(it.ID), "ended", b.ended, "error", herr)
		return nil, exclude(Result{Outcome: DeadLettered, Reason: deadletters.ReasonHandlerEndedTx,
			Err: fmt.Errorf("%w: %v", ErrTransactionControl, herr)})
	case b.tx.Conn().IsClosed():
		return nil, failed(fmt.Errorf("connection lost in a handler: %v", herr))
	case herr == nil && status == 'E':
		return errAbortedByHandler, nil // the handler swallowed a failed statement
	}
	return herr, nil
}

// replacedTx reports whether a handler that took the raw connection left
// another transaction open than the batch's ("COMMIT; BEGIN").
func (b *batch) replacedTx(ctx context.Context, status byte) bool {
	if !b.htx.raw || status != 'T' {
		return false
	}
	// Read even after a shutdown began: the answer decides whether the
	// batch's claims need repair.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.e.cfg.CommitTimeout)
	defer cancel()
	return transactionID(rctx, b.tx, false) != b.htx.xid
}

// repairEndedTx undoes what a handler that ended the batch transaction
// past the guard (a COMMIT through tx.Conn()) committed before its time: the
// inbox rows claimed for messages whose handler had not completed — and, if
// deferred writes were waiting (lost with the transaction), for those whose
// handler had. The rows are deleted on the same connection, now outside any
// transaction; the batch then runs again without the offending message.
// Writes the handlers made with tx.Exec before the early commit stay: a
// handler that ends the runtime's transaction is a bug, and this limits the
// damage to what it did itself.
func (b *batch) repairEndedTx(ctx context.Context) {
	lost := b.deferred != nil && b.deferred.Uses() > 0
	var ids []string
	for _, i := range b.runnable {
		if b.decisions[i].Decision == inbox.NewMessage && (!b.done[i] || lost) {
			ids = append(ids, b.items[i].ID)
		}
	}
	// Outside the batch transaction its lock_timeout is gone: the deadline
	// bounds a lock wait instead (pgx cancels the statement).
	ctx, cancel := b.bounded(ctx, b.p.lockTimeout)
	defer cancel()
	conn := b.tx.Conn()
	if conn.PgConn().TxStatus() != 'I' {
		// The handler began a transaction of its own after its early
		// commit: what runs in it is not the batch's; drop it.
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
	if len(ids) == 0 {
		return
	}
	if _, err := conn.Exec(ctx, b.e.sql.deleteClaims, b.scope, ids); err != nil {
		b.e.cfg.Logger.Error("could not remove the inbox rows a handler committed early; those messages count as processed",
			"messages", len(ids), "error", err)
	}
}
