package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// Options change how a batch runs. The zero value runs a live batch.
type Options struct {
	// Scope is the inbox consumer name; Config.Name when empty.
	Scope string
	// ReadOnly runs a READ ONLY transaction that is always rolled back: the
	// inbox is looked up, not claimed, and every valid item's handler runs.
	ReadOnly bool
	// Only, when set, selects the items to process; the others are Skipped.
	Only func(*Item) bool
	// Rerun runs the handler of selected items the inbox already holds.
	Rerun bool
	// MessageContext decorates each item's handler context; a batch with it
	// runs item by item, never through the batch handler.
	MessageContext func(context.Context, *Item) context.Context
	// AsyncCommit commits with synchronous_commit off (a rebuild's batches).
	AsyncCommit bool
	// TrackAttempts keeps failed attempts and original routes in the
	// attempts table (a queue with a retry queue).
	TrackAttempts bool
	// Postpone lets a message whose first write names a row another batch
	// in flight wrote leave its batch (Postponed) instead of waiting for
	// that batch's locks. Not for ordered sources or ordering keys: the
	// message then runs after later ones.
	Postpone bool
	// InOrder processes in order: once an item is to be retried, the items
	// after it are Deferred and nothing after it commits; a split batch
	// whose first half does not settle does not run its second half.
	InOrder bool
	// BeforeCommit runs last inside the transaction, with the results.
	BeforeCommit func(ctx context.Context, tx pgx.Tx, items []*Item, results []Result) error
	// Committed runs after a commit succeeded.
	Committed func(items []*Item, results []Result)
	// AfterCommit runs once a commit returned (tests simulate a crash here).
	AfterCommit func()
	// Abandon, when closed, stops the retries of a failing batch (its
	// broker session died: its messages are redelivered anyway).
	Abandon <-chan struct{}
	// Gate, when non-zero, is an advisory lock the transaction takes in
	// shared mode as it begins, in the BEGIN round trip (waiting at most
	// HandlerTimeout). A session that takes it exclusively — a rebuild
	// swapping its tables in — waits for the batches in flight and holds
	// the next ones at their start, before they touch anything.
	Gate int64
}

// plan is how one attempt runs.
type plan struct {
	savepoints  bool          // a savepoint per handler
	newClaims   bool          // claim with a plain INSERT (ClaimNewBatch)
	lockTimeout time.Duration // the transaction's lock_timeout
	serial      bool          // take the consumer's batch lock exclusively (see governor)
	fixed       []Result      // results decided before this attempt; zero Outcome: run the item
}

// batchError is a failure of the transaction as a whole: nothing in it is
// known to have committed.
type batchError struct {
	err        error
	contention bool // deadlock, serialization failure or lock timeout
	// foreign reports a conflict over a row no other batch of this process
	// wrote: with another process's batch.
	foreign bool
}

func (e *batchError) Error() string { return "batch: " + e.err.Error() }
func (e *batchError) Unwrap() error { return e.err }

func failed(err error) error { return &batchError{err: err, contention: isContention(err)} }

// isContention reports a deadlock (40P01), a serialization failure (40001)
// or a lock wait past lock_timeout (55P03): concurrent transactions wanted
// the same rows, and a retry, smaller or later, resolves it.
func isContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01" || pgErr.Code == "55P03")
}

// excludeError ends an attempt whose transaction cannot go on because of one
// item: its handler timed out, was abandoned, or tried to end the
// transaction. That item's result is decided; the others run again without it.
type excludeError struct {
	index  int
	result Result
}

func (e *excludeError) Error() string {
	return fmt.Sprintf("message %d of the batch: %v", e.index, e.result.Err)
}

var (
	// errNeedSavepoints abandons an optimistic batch whose handler failed.
	errNeedSavepoints = errors.New("engine: a handler failed; run the batch with savepoints")
	// errAlreadyClaimed abandons a ClaimNewBatch batch that meets a claimed id.
	errAlreadyClaimed = errors.New("engine: a message of the batch is in the inbox; claim it with ClaimBatch")
	// errAbortedByHandler is a handler that returned nil after a failed statement.
	errAbortedByHandler = errors.New("handler returned nil, but a statement it ran failed and aborted the transaction")
)

// batch is one attempt: one transaction over items.
type batch struct {
	e        *Engine
	o        *Options
	p        *plan
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
	unclaim   []string       // claims of Deferred items, removed before commit
	stopAt    int            // InOrder: index of the first retried item, -1 for none
	done      []bool         // items whose handler completed
	runnable  []int          // the items claimed, in batch order
	decisions []inbox.Result // their claims, indexed like items
	ended     bool           // a handler ended the transaction past the guard
	keys      []uint64       // the rows the batch's handlers wrote (see writeKeys)
	gone      bool           // abandoned: its write keys were released for good (guarded by writeKeys.mu)
}

// attempt runs items once, in one transaction, and returns each item's
// result; an error means nothing is known to have committed.
func (e *Engine) attempt(ctx context.Context, items []*Item, o *Options, p *plan, w *watch) (_ []Result, err error) {
	b := e.newBatch(ctx, items, o, p, w)
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
	if o.ReadOnly {
		return b.results, nil // end rolls back
	}
	if err := b.commit(ctx); err != nil {
		return nil, err
	}
	return b.results, nil
}

func (e *Engine) newBatch(ctx context.Context, items []*Item, o *Options, p *plan, w *watch) *batch {
	b := &batch{e: e, o: o, p: p, items: items, watch: w, stopAt: -1, done: make([]bool, len(items)),
		results: make([]Result, len(items)), ctxs: make([]context.Context, len(items)), spans: make([]trace.Span, len(items)),
		hctxs: make([]handlerContext, len(items))}
	b.scope = o.Scope
	if b.scope == "" {
		b.scope = e.cfg.Name
	}
	if !p.savepoints && !o.ReadOnly && !o.Rerun {
		b.deferred = &idem.Deferred{} // handlers' writes that can wait for the end of the batch
		ctx = idem.WithDeferred(ctx, b.deferred)
	}
	ctx, expire := context.WithCancelCause(ctx)
	w.arm(expire) // the handlers' deadline, which the supervisor enforces
	b.handlerCtx = ctx
	for i, it := range items {
		b.ctxs[i], b.spans[i] = e.tel.startSpan(ctx, it, len(items))
		if o.MessageContext != nil {
			b.ctxs[i] = o.MessageContext(b.ctxs[i], it)
		}
	}
	e.tel.batch(ctx, len(items))
	return b
}

// end closes the attempt's spans and, unless it committed, rolls back.
func (b *batch) end(err error) {
	ex, _ := errors.AsType[*excludeError](err)
	for i, span := range b.spans {
		r := b.results[i]
		switch {
		case ex != nil && ex.index == i:
			r = ex.result
		case err != nil:
			r = Result{Outcome: Unresolved, Err: err}
		}
		endSpan(span, r)
	}
	// The rows stay named until the transaction that locked them ended.
	defer b.e.keys.release(b, b.keys)
	if b.conn == nil || !b.watch.release() {
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
	wait := b.p.lockTimeout
	if b.p.serial {
		wait = b.e.cfg.HandlerTimeout // queued behind other processes' batches
	}
	ctx, cancel := b.bounded(ctx, wait)
	defer cancel()
	conn, err := b.e.cfg.Pool.Acquire(ctx)
	if err != nil {
		return &batchError{err: fmt.Errorf("acquire a connection: %w", err)}
	}
	b.conn = conn
	b.watch.hold(conn, b)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: b.e.beginSQL(conn, b.o, b.p)})
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
// of hanging it.
func (b *batch) bounded(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, wait+b.e.cfg.CommitTimeout)
}

// checkInterval is client_connection_check_interval inside batches.
const checkInterval = time.Second

// beginSQL is BEGIN with the batch's settings, sent in one round trip.
func (e *Engine) beginSQL(conn *pgxpool.Conn, o *Options, p *plan) string {
	var sb strings.Builder
	sb.WriteString("BEGIN")
	if o.ReadOnly {
		sb.WriteString(" READ ONLY")
	}
	setMillis := func(name string, d time.Duration) {
		sb.WriteString("; SET LOCAL ")
		sb.WriteString(name)
		sb.WriteString(" = ")
		sb.WriteString(strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	}
	if o.Gate != 0 || !o.ReadOnly {
		setMillis("lock_timeout", e.cfg.HandlerTimeout)
	}
	if o.Gate != 0 {
		// The gate first: a batch held at it holds nothing else, so that
		// the batches the gate's holder runs meanwhile (a swap's catch-up)
		// are not queued behind it on the batch lock.
		sb.WriteString("; SELECT pg_advisory_xact_lock_shared(")
		sb.WriteString(strconv.FormatInt(o.Gate, 10))
		sb.WriteString(")")
	}
	if !o.ReadOnly {
		// The consumer's batch lock, shared by the batches of every process:
		// a batch of a process whose batches conflict with other processes'
		// (see governor) takes it exclusively, and so runs alone, queued
		// behind and before the others instead of timing out on their rows.
		if p.serial {
			sb.WriteString("; SELECT pg_advisory_xact_lock(")
		} else {
			sb.WriteString("; SELECT pg_advisory_xact_lock_shared(")
		}
		sb.WriteString(strconv.FormatInt(e.serialKey, 10))
		sb.WriteString(")")
	}
	setMillis("lock_timeout", p.lockTimeout)
	setMillis("idle_in_transaction_session_timeout", e.cfg.HandlerTimeout+abandonGrace+5*time.Second)
	if e.serverMajor(conn) >= 14 {
		setMillis("client_connection_check_interval", checkInterval)
	}
	if o.AsyncCommit {
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
			b.results[i] = Result{Outcome: Deferred}
		case b.p.fixed != nil && b.p.fixed[i].Outcome != 0:
			b.results[i] = b.p.fixed[i]
			if b.o.InOrder && b.results[i].Outcome == Retry {
				b.stopAt = i
			}
		case b.o.Only != nil && !b.o.Only(it):
			b.results[i] = Result{Outcome: Skipped} // untouched, even if invalid
		case it.Reject != nil:
			b.results[i] = Result{Outcome: DeadLettered, Reason: it.Reject.Reason, Err: it.Reject.Err}
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
	ctx, cancel := b.bounded(ctx, b.p.lockTimeout)
	defer cancel()
	if b.o.TrackAttempts {
		if err := b.e.lookupAttempts(ctx, b.tx, b.scope, b.items, runnable); err != nil {
			return nil, failed(err)
		}
	}
	order := slices.Clone(runnable)
	if !b.o.ReadOnly {
		slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(b.items[i].ID, b.items[j].ID) })
	}
	claims := make([]inbox.Claim, len(order))
	for k, i := range order {
		it := b.items[i]
		claims[k] = inbox.Claim{Consumer: b.scope, MessageID: it.ID, PayloadHash: it.Hash, BusinessKey: it.BusinessKey, Source: it.Source}
		if it.HasOffset {
			claims[k].StreamOffset = &it.Offset
		}
	}
	got, err := b.e.decide(ctx, b.tx, claims, b.o, b.p)
	if errors.Is(err, inbox.ErrClaimed) {
		return nil, errAlreadyClaimed
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
func (e *Engine) decide(ctx context.Context, tx pgx.Tx, claims []inbox.Claim, o *Options, p *plan) ([]inbox.Result, error) {
	switch {
	case o.ReadOnly:
	case p.newClaims:
		return e.inbox.ClaimNewBatch(ctx, tx, claims)
	default:
		return e.inbox.ClaimBatch(ctx, tx, claims)
	}
	out := make([]inbox.Result, len(claims))
	for i, cl := range claims {
		rec, err := e.inbox.Lookup(ctx, tx, cl.Consumer, cl.MessageID)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			out[i] = inbox.Result{Decision: inbox.NewMessage, StoredHash: cl.PayloadHash}
		case err != nil:
			return nil, err
		case rec.PayloadHash == cl.PayloadHash:
			out[i] = inbox.Result{Decision: inbox.Duplicate, StoredHash: rec.PayloadHash}
		default:
			out[i] = inbox.Result{Decision: inbox.Conflict, StoredHash: rec.PayloadHash}
		}
	}
	return out, nil
}

// commit flushes the deferred writes, writes the dead-letter rows, attempt
// counts and the source's own rows, and commits.
func (b *batch) commit(ctx context.Context) error {
	ctx, cancel := b.bounded(ctx, b.p.lockTimeout)
	defer cancel()
	if b.deferred != nil {
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
	records := &pgx.Batch{}
	b.e.queueRecords(records, b.scope, b.o, b.items, b.results)
	if records.Len() > 0 {
		if err := b.tx.SendBatch(ctx, records).Close(); err != nil {
			return failed(fmt.Errorf("record dead letters and attempts: %w", err))
		}
	}
	if b.o.BeforeCommit != nil {
		if err := b.o.BeforeCommit(ctx, b.tx, b.items, b.results); err != nil {
			return failed(err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.e.cfg.CommitTimeout)
	defer cancel()
	start := time.Now()
	err := b.tx.Commit(cctx)
	b.e.tel.commitTime(ctx, time.Since(start))
	if err != nil {
		return failed(fmt.Errorf("commit: %w", err))
	}
	b.e.Counts.Batches.Add(1)
	if b.o.Committed != nil {
		b.o.Committed(b.items, b.results)
	}
	if b.o.AfterCommit != nil {
		b.o.AfterCommit()
	}
	return nil
}
