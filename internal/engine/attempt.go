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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/tracing"
)

// batch is one attempt: one transaction over items, with its own
// bookkeeping (the watch that supervised shares, the rows its handlers
// wrote, its spans).
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
	done      []bool         // items whose handler completed
	runnable  []int          // the items claimed, in batch order
	decisions []inbox.Result // their claims, indexed like items
	ended     bool           // a handler ended the transaction past the guard
	keys      []uint64       // the rows the batch's handlers wrote (see writeKeys)
	gone      bool           // abandoned: its write keys were released for good (guarded by writeKeys.mu)
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
	if !pl.savepoints && p.inbox == inboxClaim {
		b.deferred = &idem.Deferred{} // handlers' writes that can wait for the end of the batch
		ctx = idem.WithDeferred(ctx, b.deferred)
	}
	ctx, expire := context.WithCancelCause(ctx)
	w.arm(expire) // the handlers' deadline, which the supervisor enforces
	b.handlerCtx = ctx
	for i, it := range items {
		b.ctxs[i], b.spans[i] = e.tel.startSpan(ctx, it, len(items))
		if p.messageContext != nil {
			b.ctxs[i] = p.messageContext(b.ctxs[i], it)
		}
	}
	e.tel.batchSize.Record(ctx, int64(len(items)), e.tel.baseRecord...)
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
			r = Result{Outcome: idem.Unresolved, Err: err}
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
	b.watch.hold(conn, b)
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
// of hanging it.
func (b *batch) bounded(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, wait+b.e.cfg.CommitTimeout)
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
	b.e.tel.commitDur.Record(ctx, time.Since(start).Seconds(), b.e.tel.baseRecord...)
	if err != nil {
		return failed(fmt.Errorf("commit: %w", err))
	}
	b.e.Counts.Batches.Add(1)
	if b.rules.committed != nil {
		b.rules.committed(b.items, b.results)
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

// watch is what the supervisor of an attempt knows about it: which handler
// runs, since when, and whether the attempt was abandoned. The attempt's
// goroutine owns its connection except while a handler runs; the
// supervisor may take it then, and only then (see abandon.go). The handler
// stage marks its handlers in and out (enter, leave: handlers.go).
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

func (w *watch) hold(conn *pgxpool.Conn, b *batch) {
	w.mu.Lock()
	w.conn, w.owner = conn, b
	w.mu.Unlock()
}

// arm hands the watch the function that ends the attempt's handler context.
func (w *watch) arm(expire context.CancelCauseFunc) {
	w.mu.Lock()
	w.expire = expire
	w.mu.Unlock()
}

// finish ends the attempt's handler context, once the attempt is over or
// abandoned.
func (w *watch) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.expire != nil {
		w.expire(context.Canceled)
	}
}

// release reports whether the connection is still the attempt's to release.
func (w *watch) release() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.abandoned
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

// startSpan starts the process span of one message, a child of the trace
// context found in its headers (W3C trace context by default), named and
// attributed after the messaging semantic conventions: for a queue the
// destination is the exchange the message was published to (with its
// routing key and the delivery tag), for a stream the stream.
func (t *Telemetry) startSpan(ctx context.Context, it *Item, batchSize int) (context.Context, trace.Span) {
	if len(it.Headers) > 0 {
		ctx = tracing.Propagator(nil).Extract(ctx, tracing.AMQPCarrier(it.Headers))
	}
	ctx, span := t.tracer.Start(ctx, "process "+it.Source, t.spanStart...)
	if !span.IsRecording() {
		return ctx, span // tracing is off: build no attributes
	}
	destination := it.Exchange
	if it.HasOffset {
		destination = it.Source
	}
	span.SetAttributes(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(destination),
		semconv.MessagingDestinationSubscriptionName(it.Source),
		semconv.MessagingConsumerGroupName(t.name),
		semconv.MessagingMessageID(it.ID),
		semconv.MessagingMessageBodySize(len(it.Body)),
		semconv.MessagingBatchMessageCount(batchSize),
	)
	if it.CorrelationID != "" {
		span.SetAttributes(semconv.MessagingMessageConversationID(it.CorrelationID))
	}
	if it.RoutingKey != "" {
		span.SetAttributes(semconv.MessagingRabbitMQDestinationRoutingKey(it.RoutingKey))
	}
	if it.DeliveryTag != 0 {
		span.SetAttributes(semconv.MessagingRabbitMQMessageDeliveryTag(int(it.DeliveryTag)))
	}
	if it.HasOffset {
		span.SetAttributes(attribute.String("messaging.rabbitmq.stream.offset", strconv.FormatInt(it.Offset, 10)))
	}
	return ctx, span
}

// endSpan records the message's outcome on its span.
func endSpan(span trace.Span, r Result) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attribute.String("idem.outcome", r.Outcome.String()))
	if r.Reason != "" {
		span.SetAttributes(attribute.String("idem.dead_letter.reason", r.Reason))
	}
	if r.Err != nil && r.Outcome != idem.Processed {
		span.SetStatus(codes.Error, r.Err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(r.Outcome.String()))
	}
	span.End()
}
