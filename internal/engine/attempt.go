package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// batch is one attempt: one transaction over items, with its own
// bookkeeping (the watch that supervised shares, the rows its handlers
// wrote, its spans). The batch's stages are methods of their own files:
// this one begins, claims, commits and ends it; handlers.go runs its
// handlers.
type batch struct {
	e        *Engine
	rules    *rules
	plan     *plan
	scope    string
	items    []*Item
	results  []Result
	ctxs     []context.Context
	spans    []trace.Span
	watch    *watch
	conn     *pgxpool.Conn
	tx       pgx.Tx
	htx      *handlerTx
	deferred *idem.Deferred
	// handlerCtx is what every handler's context derives from.
	handlerCtx context.Context
	// hctxs are the items' handler contexts, batchHctx the batch
	// handler's: one allocation per batch, not one per handler.
	hctxs     []handlerContext
	batchHctx handlerContext
	unclaim   []string       // claims of Held items, removed before commit
	stopAt    int            // InOrder: index of the first retried item, -1 for none
	keyStops  map[string]int // byKey: index of the first item of each key retried or waiting
	done      []bool         // items whose handler completed
	runnable  []int          // the items claimed, in batch order
	decisions []inbox.Result // their claims, indexed like items
	ended     bool           // a handler ended the transaction past the guard
	keys      []uint64       // the rows the batch's handlers wrote (see writeKeys)
	gone      bool           // abandoned: its write keys were released for good (guarded by writeKeys.mu)
	// expire ends the handlers' context (handlerCtx) with its cause: the
	// watch calls it when a handler runs past its deadline, end when the
	// attempt is over.
	expire context.CancelCauseFunc
	// abandoned reports that the supervisor abandoned the attempt while a
	// handler ran: its connection is not the attempt's any more.
	abandoned bool
	// took is how long each handler that returned ran, commitTook how long
	// the commit took (0: no commit): recorded when the attempt ends. A
	// batch of one or two messages keeps took in tookBuf.
	took       []time.Duration
	tookBuf    [2]time.Duration
	commitTook time.Duration
}

// attempt runs items once, in one transaction, and returns each item's
// result; an error means nothing is known to have committed.
func (e *Engine) attempt(ctx context.Context, items []*Item, p *rules, pl *plan, w *watch) (_ []Result, err error) {
	b := e.newBatch(ctx, items, p, pl, w)
	defer func() { b.end(err) }()
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	runnable := b.decideFixed()
	decisions, err := b.claim(ctx, runnable)
	if err != nil {
		return nil, err
	}
	if err := b.runHandlers(ctx, runnable, decisions); err != nil {
		return nil, err
	}
	if p.inbox == inboxLook {
		return b.results, nil // end rolls back
	}
	if err := b.commit(ctx); err != nil {
		return nil, err
	}
	return b.results, nil
}

func (e *Engine) newBatch(ctx context.Context, items []*Item, p *rules, pl *plan, w *watch) *batch {
	b := &batch{e: e, rules: p, plan: pl, items: items, watch: w, stopAt: -1, scope: p.scope,
		done: make([]bool, len(items)), results: make([]Result, len(items)), ctxs: make([]context.Context, len(items)),
		spans: make([]trace.Span, len(items)), hctxs: make([]handlerContext, len(items))}
	b.took = b.tookBuf[:0]
	if len(items) > len(b.tookBuf) {
		b.took = make([]time.Duration, 0, len(items))
	}
	if !pl.savepoints && p.inbox == inboxClaim {
		b.deferred = &idem.Deferred{} // handlers' writes that can wait for the end of the batch
		ctx = idem.WithDeferred(ctx, b.deferred)
	}
	// The handlers' deadline, which the supervisor enforces (see watch).
	b.handlerCtx, b.expire = context.WithCancelCause(ctx)
	e.tel.startBatch(b.handlerCtx, items, b.ctxs, b.spans)
	if p.messageContext != nil {
		for i, it := range items {
			b.ctxs[i] = p.messageContext(b.ctxs[i], it)
		}
	}
	return b
}

// end records the attempt (its spans, its timings), rolls back unless it
// committed, and ends the handlers' context.
func (b *batch) end(err error) {
	defer b.expire(context.Canceled) // once the attempt is over
	final := b.results
	if err != nil {
		ex, _ := errors.AsType[*excludeError](err)
		final = make([]Result, len(b.results))
		for i := range final {
			final[i] = Result{Outcome: idem.Unresolved, Err: err}
			if ex != nil && ex.index == i {
				final[i] = ex.result
			}
		}
	}
	b.e.tel.endBatch(b.handlerCtx, b.spans, final, b.took, b.commitTook)
	// The rows stay named until the transaction that locked them ended.
	defer b.e.keys.release(b, b.keys)
	if b.conn == nil || b.abandoned {
		return // never began, or abandoned: the connection is not ours any more
	}
	if b.tx != nil {
		rctx, cancel := context.WithTimeout(context.Background(), b.e.cfg.CommitTimeout)
		_ = b.tx.Rollback(rctx) // a no-op after commit
		cancel()
	}
	b.conn.Release()
}

// begin takes a connection and opens the transaction with the batch's
// bounds: lock waits, idle time inside the transaction, and (PostgreSQL 14+)
// a check that the client is still there while a statement runs, so that a
// dead worker's backend cannot hold inbox locks.
func (b *batch) begin(ctx context.Context) error {
	wait := b.plan.lockTimeout
	if b.plan.serial {
		wait = b.e.cfg.HandlerTimeout // queued behind other processes' batches
	}
	ctx, cancel := b.bounded(ctx, wait)
	defer cancel()
	conn, err := b.e.cfg.Pool.Acquire(ctx)
	if err != nil {
		return &batchError{err: fmt.Errorf("acquire a connection: %w", err)}
	}
	b.conn = conn
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: b.e.beginSQL(conn, b.rules, b.plan)})
	if err != nil {
		return &batchError{err: fmt.Errorf("begin: %w", err)}
	}
	b.tx = tx
	b.htx = &handlerTx{Tx: tx, b: b}
	return nil
}

// bounded bounds one of the runtime's own statements: a lock wait of wait
// at most, then CommitTimeout more, so that a connection that stopped
// answering (a half-open socket after a failover) fails the attempt instead
// of hanging it. Until the returned function is called, the statement is
// one the runtime waits on (Vitals.Unanswered): readiness sees one that goes
// unanswered long before CommitTimeout ends it.
func (b *batch) bounded(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, wait+b.e.cfg.CommitTimeout)
	answered := b.e.Vitals.calls.Begin(wait)
	return ctx, func() {
		answered()
		cancel()
	}
}

// checkInterval is client_connection_check_interval inside batches.
const checkInterval = time.Second

// beginSQL is BEGIN with the batch's settings, sent in one round trip.
func (e *Engine) beginSQL(conn *pgxpool.Conn, p *rules, pl *plan) string {
	var sb strings.Builder
	// READ COMMITTED whatever the session's default: a claim that waited
	// for another transaction's row lock, and every statement after it,
	// must see what that transaction committed (a clean-up's horizon, a
	// concurrent claim).
	sb.WriteString("BEGIN ISOLATION LEVEL READ COMMITTED")
	if p.inbox == inboxLook {
		sb.WriteString(" READ ONLY")
	}
	setMillis := func(name string, d time.Duration) {
		sb.WriteString("; SET LOCAL ")
		sb.WriteString(name)
		sb.WriteString(" = ")
		sb.WriteString(strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	}
	if p.gate != 0 || p.inbox != inboxLook {
		setMillis("lock_timeout", e.cfg.HandlerTimeout)
	}
	if p.gate != 0 {
		// The gate first: a batch held at it holds nothing else, so that
		// the batches the gate's holder runs meanwhile (a swap's catch-up)
		// are not queued behind it on the batch lock.
		sb.WriteString("; SELECT pg_advisory_xact_lock_shared(")
		sb.WriteString(strconv.FormatInt(p.gate, 10))
		sb.WriteString(")")
	}
	if p.inbox != inboxLook {
		// The consumer's batch lock, shared by the batches of every process:
		// a batch of a process whose batches conflict with other processes'
		// (see governor) takes it exclusively, and so runs alone, queued
		// behind and before the others instead of timing out on their rows.
		if pl.serial {
			sb.WriteString("; SELECT pg_advisory_xact_lock(")
		} else {
			sb.WriteString("; SELECT pg_advisory_xact_lock_shared(")
		}
		sb.WriteString(strconv.FormatInt(e.serialKey, 10))
		sb.WriteString(")")
	}
	setMillis("lock_timeout", pl.lockTimeout)
	setMillis("idle_in_transaction_session_timeout", e.cfg.HandlerTimeout+abandonGrace+5*time.Second)
	if e.serverMajor(conn) >= 14 {
		setMillis("client_connection_check_interval", checkInterval)
	}
	if p.asyncCommit {
		sb.WriteString("; SET LOCAL synchronous_commit = off")
	}
	return sb.String()
}

// serverMajor is the PostgreSQL major version, read once from a connection.
func (e *Engine) serverMajor(conn *pgxpool.Conn) int {
	if v := e.major.Load(); v != 0 {
		return int(v)
	}
	var n int
	if f := strings.FieldsFunc(conn.Conn().PgConn().ParameterStatus("server_version"), func(r rune) bool { return r < '0' || r > '9' }); len(f) > 0 {
		n, _ = strconv.Atoi(f[0])
	}
	e.major.Store(int32(max(n, 1)))
	return n
}

// decideFixed sets the results known before anything runs (decided by an
// earlier attempt, not selected, rejected at preparation, after an item
// retried in order) and returns the indexes of the items to claim.
func (b *batch) decideFixed() []int {
	runnable := make([]int, 0, len(b.items))
	for i, it := range b.items {
		switch {
		case b.stopAt >= 0:
			b.results[i] = Result{Outcome: idem.Held}
		case b.plan.fixed != nil && b.plan.fixed[i].Outcome != 0:
			b.results[i] = b.plan.fixed[i]
			if b.rules.inOrder && b.results[i].Outcome == idem.Retried {
				b.stopAt = i
			}
			if b.rules.byKey && !b.results[i].Outcome.Final() {
				b.stopKey(i)
			}
		case b.rules.selected != nil && !b.rules.selected(it.Message):
			b.results[i] = Result{Outcome: idem.Skipped} // untouched, even if invalid
		case it.Reject != nil:
			b.results[i] = Result{Outcome: idem.DeadLettered, Reason: it.Reject.Reason, Err: it.Reject.Err}
		default:
			runnable = append(runnable, i)
		}
	}
	return runnable
}

// claim claims the runnable items in the inbox with one statement (or,
// read-only, looks them up), in the order of their ids, so that concurrent
// batches, in this process or another, take the inbox's row locks in one
// order and wait for each other instead of deadlocking. It returns the
// decisions indexed like items.
func (b *batch) claim(ctx context.Context, runnable []int) ([]inbox.Result, error) {
	if len(runnable) == 0 {
		return nil, nil
	}
	ctx, cancel := b.bounded(ctx, b.plan.lockTimeout)
	defer cancel()
	if b.rules.retryQueue && slices.ContainsFunc(runnable, func(i int) bool {
		it := b.items[i]
		return it.row == nil && (it.Returned || it.Suspect)
	}) {
		if err := b.e.lookupAttempts(ctx, b.tx, b.scope, b.items, runnable); err != nil {
			return nil, failed(err)
		}
	}
	order := slices.Clone(runnable)
	if b.rules.inbox != inboxLook {
		slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(b.items[i].ID, b.items[j].ID) })
	}
	claims := make([]inbox.Claim, len(order))
	for k, i := range order {
		m := b.items[i].Message
		claims[k] = inbox.Claim{Consumer: b.scope, MessageID: m.ID, PayloadHash: m.Hash, BusinessKey: m.BusinessKey, Source: m.Source}
		if m.HasOffset {
			claims[k].StreamOffset = &m.Offset
		}
	}
	got, err := b.e.decide(ctx, b.tx, claims, b.rules, b.plan)
	if errors.Is(err, inbox.ErrClaimed) {
		return nil, errAlreadyClaimed
	}
	if errors.Is(err, inbox.ErrLayoutChanged) {
		return nil, errLayoutChanged
	}
	if err != nil {
		return nil, failed(err)
	}
	decisions := make([]inbox.Result, len(b.items))
	for k, i := range order {
		decisions[i] = got[k]
	}
	return decisions, nil
}

// decide claims the messages in the inbox, or, read-only, looks them up.
func (e *Engine) decide(ctx context.Context, tx pgx.Tx, claims []inbox.Claim, p *rules, pl *plan) ([]inbox.Result, error) {
	switch {
	case p.inbox == inboxLook:
		return e.inbox.LookupClaims(ctx, tx, claims)
	case pl.newClaims:
		return e.inbox.ClaimNewBatch(ctx, tx, claims)
	default:
		return e.inbox.ClaimBatch(ctx, tx, claims)
	}
}

// commit flushes the deferred writes, writes the dead-letter rows, attempt
// counts and the source's own rows, and commits.
func (b *batch) commit(ctx context.Context) error {
	ctx, cancel := b.bounded(ctx, b.plan.lockTimeout)
	defer cancel()
	if b.deferred != nil && b.deferred.Uses() > 0 {
		if err := b.deferred.Flush(ctx, b.tx); err != nil {
			if isContention(err) {
				return &batchError{err: err, contention: true}
			}
			// A deferred write failed (an effect conflict, say): run the
			// batch again with immediate writes, so the error reaches the
			// handler that caused it.
			return errNeedSavepoints
		}
	}
	if len(b.unclaim) > 0 {
		if _, err := b.e.inbox.UnclaimBatch(ctx, b.tx, b.scope, b.unclaim); err != nil {
			return failed(err)
		}
	}
	if b.hasRecords() {
		if err := b.e.writeRecords(ctx, b.tx, b.scope, b.rules, b.items, b.results); err != nil {
			return failed(err)
		}
	}
	if b.rules.beforeCommit != nil {
		if err := b.rules.beforeCommit(ctx, b.tx, b.items, b.results); err != nil {
			return failed(err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.e.cfg.CommitTimeout)
	defer cancel()
	start := time.Now()
	err := b.tx.Commit(cctx)
	b.commitTook = max(time.Since(start), time.Nanosecond)
	if err != nil {
		return failed(fmt.Errorf("commit: %w", err))
	}
	b.e.Counts.Batches.Add(1)
	if b.rules.settled != nil {
		for i, r := range b.results {
			if r.Outcome.Final() {
				b.rules.settled[b.items[i].Offset] = true
			}
		}
	}
	if b.rules.afterCommit != nil {
		b.rules.afterCommit()
	}
	return nil
}

// hasRecords reports whether the batch has rows to write besides the inbox
// (see writeRecords): a dead letter, or with a retry queue a failed attempt
// or the attempts row of a message settled for good.
func (b *batch) hasRecords() bool {
	for i, r := range b.results {
		switch {
		case r.Outcome == idem.DeadLettered:
			return true
		case !b.rules.retryQueue:
		case r.Outcome == idem.Retried, b.items[i].row != nil && r.Outcome.Final():
			return true
		}
	}
	return false
}

// writeKeys is the in-process table of the rows that batches in flight
// have written, as far as the runtime can name a row without parsing SQL: a
// write statement's text with all its arguments (rowKey). Two handlers that
// run the same statement with the same arguments (UPDATE accounts SET
// balance = balance + 1 WHERE id = $1, with one account) write the same
// row; the second would wait for the first batch to commit, or deadlock
// with it. Instead, a message whose first write names a row another batch
// in flight already wrote is postponed: nothing of it was written yet, so
// it leaves its batch and runs in a later one. Statements that differ in any
// argument get different keys, so the table never postpones on a guess;
// conflicts it cannot name are left to PostgreSQL (lock_timeout, then a
// retry).
//
// A message that cannot be postponed (it wrote already, or was postponed
// often enough) writes the row anyway, after the other batch's lock: its
// batch then holds the row too, and the key stays in the table until every
// batch that holds it has ended (release, when the attempt ends), so that
// no third batch takes the row for free and waits on a lock the table does
// not show.
type writeKeys struct {
	mu   sync.Mutex
	rows map[uint64]holders
}

// holders are the batches in flight that wrote one row: first, and, rarely,
// more that wrote it after first's lock.
type holders struct {
	first *batch
	more  []*batch
}

func newWriteKeys() *writeKeys { return &writeKeys{rows: map[uint64]holders{}} }

// take records that b writes the row named key, and reports whether b
// holds it alone: no other batch in flight wrote it. When another did, b is
// recorded only if force (it writes the row anyway). An abandoned batch is
// never recorded: its keys were released for good.
func (k *writeKeys) take(b *batch, key uint64, force bool) (alone bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if b.gone {
		return true
	}
	h, ok := k.rows[key]
	switch {
	case !ok:
		k.rows[key] = holders{first: b}
		return true
	case h.first == b && len(h.more) == 0:
		return true
	case force && h.first != b && !slices.Contains(h.more, b):
		h.more = append(h.more, b)
		k.rows[key] = h
	}
	return false
}

// drop removes b from the holders of key; mu must be held.
func (k *writeKeys) drop(b *batch, key uint64) {
	h, ok := k.rows[key]
	if !ok {
		return
	}
	if h.first == b {
		if len(h.more) == 0 {
			delete(k.rows, key)
			return
		}
		h.first, h.more = h.more[0], h.more[1:]
	} else {
		h.more = slices.DeleteFunc(h.more, func(o *batch) bool { return o == b })
	}
	k.rows[key] = h
}

// release forgets that b holds the rows named keys: its transaction ended.
func (k *writeKeys) release(b *batch, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	k.mu.Lock()
	for _, key := range keys {
		k.drop(b, key)
	}
	k.mu.Unlock()
}

// abandon marks b abandoned and forgets every row it holds, from another
// goroutine than b's own: its handler still runs, and whatever it writes
// from now on is not recorded (its backend is being terminated).
func (k *writeKeys) abandon(b *batch) {
	k.mu.Lock()
	b.gone = true
	for key, h := range k.rows {
		if h.first == b || slices.Contains(h.more, b) {
			k.drop(b, key)
		}
	}
	k.mu.Unlock()
}

// held is how many rows the table holds (tests).
func (k *writeKeys) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.rows)
}
