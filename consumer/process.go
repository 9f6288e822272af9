package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
)

// outcome is what became of one message in a batch.
type outcome int

const (
	// outcomeProcessed: the handler ran and its writes committed with the inbox row.
	outcomeProcessed outcome = iota
	// outcomeDuplicate: the inbox already held the id with the same hash.
	outcomeDuplicate
	// outcomeDeadLettered: a dead-letter row committed; the message goes to the DLQ.
	outcomeDeadLettered
	// outcomeRetry: nothing committed for it; try again after a delay.
	outcomeRetry
	// outcomeUnresolved: the batch transaction failed; hand it back to the broker.
	outcomeUnresolved
	// outcomeSkipped: not selected by a replay; nothing was done.
	outcomeSkipped
	// outcomeDeferred: not attempted because an earlier message of the
	// batch is being retried (stopAtRetry); run it again after that one.
	outcomeDeferred
)

func (o outcome) String() string {
	switch o {
	case outcomeProcessed:
		return "processed"
	case outcomeDuplicate:
		return "duplicate"
	case outcomeDeadLettered:
		return "dead_lettered"
	case outcomeRetry:
		return "retried"
	case outcomeSkipped:
		return "skipped"
	case outcomeDeferred:
		return "deferred"
	default:
		return "unresolved"
	}
}

// result is the outcome of one message plus what the source needs to act on it.
type result struct {
	outcome    outcome
	reason     string    // dead-letter reason
	err        error     // handler error or dead-letter cause
	storedHash idem.Hash // for payload conflicts
	inbox      inbox.Decision
}

// batchError is a failure of the batch transaction as a whole: nothing in it
// is known to have committed.
type batchError struct {
	err        error
	contention bool // deadlock or serialization failure
}

func (e *batchError) Error() string { return "batch: " + e.err.Error() }
func (e *batchError) Unwrap() error { return e.err }

// isContention reports a deadlock (40P01) or serialization failure (40001).
func isContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// prepare fills the fields the runtime derives from a delivery (hash, id,
// business key) and marks messages that cannot be processed. rawID is the
// AMQP message-id property (or the stream's message id).
func (c *Consumer) prepare(m *Message, rawID string) {
	m.rawID = rawID
	if len(m.Body) > c.cfg.MaxMessageBytes {
		c.tel.limit("message_bytes")
		m.deadLetter = &DeadLetterError{Reason: ReasonTooLarge,
			Err: fmt.Errorf("body has %d bytes, limit is %d", len(m.Body), c.cfg.MaxMessageBytes)}
		m.Hash = idem.HashBytes(m.Body)
		return
	}
	if len(m.Headers) > c.cfg.MaxHeaders {
		c.tel.limit("headers")
		m.deadLetter = &DeadLetterError{Reason: ReasonTooManyHeaders,
			Err: fmt.Errorf("message has %d headers, limit is %d", len(m.Headers), c.cfg.MaxHeaders)}
		m.Hash = idem.HashBytes(m.Body)
		return
	}
	h, err := c.cfg.Hash(m.Body)
	if err != nil {
		m.Hash = idem.HashBytes(m.Body)
		m.deadLetter = &DeadLetterError{Reason: ReasonDecodeError, Err: fmt.Errorf("hash payload: %w", err)}
		return
	}
	m.Hash = h
	id, err := c.cfg.MessageID(m, rawID)
	switch {
	case err != nil:
		m.deadLetter = &DeadLetterError{Reason: ReasonInvalidMessageID, Err: err}
		return
	case id == "":
		m.deadLetter = &DeadLetterError{Reason: ReasonMissingMessageID, Err: errMissingID}
		return
	case len(id) > c.cfg.MaxIDBytes:
		c.tel.limit("id_bytes")
		m.deadLetter = &DeadLetterError{Reason: ReasonInvalidMessageID,
			Err: fmt.Errorf("message id has %d bytes, limit is %d", len(id), c.cfg.MaxIDBytes)}
		m.ID = cleanText(id[:64])
		return
	case !utf8.ValidString(id) || containsNUL(id):
		m.deadLetter = &DeadLetterError{Reason: ReasonInvalidMessageID, Err: errors.New("message id is not valid UTF-8 text")}
		return
	}
	m.ID = id
	if c.cfg.BusinessKey != nil {
		key, err := c.cfg.BusinessKey(m)
		if err == nil && (len(key) > c.cfg.MaxIDBytes || !utf8.ValidString(key) || containsNUL(key)) {
			err = fmt.Errorf("business key is not valid UTF-8 text of at most %d bytes", c.cfg.MaxIDBytes)
		}
		if err != nil {
			m.deadLetter = &DeadLetterError{Reason: ReasonInvalidKey, Err: err}
			return
		}
		m.BusinessKey = key
	}
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// batchOptions change how a batch runs: sources add checkpoints, replays
// change the inbox scope, run read-only, or re-run selected messages.
type batchOptions struct {
	// scope is the inbox consumer name; Config.Name when empty.
	scope string
	// readOnly runs a READ ONLY transaction that is always rolled back: the
	// inbox is looked up, not claimed, and every valid message's handler runs.
	readOnly bool
	// only, when set, selects the messages to process; the others are skipped.
	only func(*Message) bool
	// rerun runs the handler of selected messages the inbox already holds.
	rerun bool
	// savepoints puts each handler in a savepoint of its own. Without it a
	// batch runs optimistically, and the first handler error sends the
	// whole batch back to run again with savepoints (errNeedSavepoints).
	savepoints bool
	// newClaims claims with inbox.ClaimNewBatch (a plain INSERT), which
	// fails the batch with errAlreadyClaimed if a message is claimed
	// already; then it runs again with ClaimBatch. Never with savepoints,
	// read-only or rerun batches.
	newClaims bool
	// asyncCommit sets synchronous_commit off for the batch (BatchOptions.AsyncCommit).
	asyncCommit bool
	// messageContext decorates each message's handler context.
	messageContext func(context.Context, *Message) context.Context
	// beforeCommit runs last inside the transaction (checkpoints, audit
	// rows), with the messages of this transaction and their results.
	beforeCommit func(ctx context.Context, tx pgx.Tx, msgs []*Message, results []result) error
	// committed runs after a commit succeeded, with the same messages and
	// results.
	committed func(msgs []*Message, results []result)
	// stopAtRetry keeps processing in order: once a message is to be
	// retried, the messages after it in the batch are not attempted
	// (outcomeDeferred) and nothing after it commits. Ordered sources (a
	// stream, a replay) retry in place and must not commit past it.
	stopAtRetry bool
	// inOrder keeps a split batch in order: when a half does not settle,
	// the halves after it do not run (a stream's checkpoint must never pass
	// a message that is not settled).
	inOrder bool
	// afterCommit runs once the commit returned without error (tests use it
	// to simulate a crash between commit and ack).
	afterCommit func()
	// abandon, when closed, stops retries of a failing batch (its broker
	// session died: the messages will be redelivered anyway).
	abandon <-chan struct{}
}

// processBatch runs msgs in one transaction: one claim statement for the
// batch, then the handlers, one commit. With savepoints, each handler runs in
// a savepoint of its own, so that a failure rolls back only its message (and
// unclaims it). Without, handlers run back to back, saving a round trip per
// message, and the first failure abandons the batch with errNeedSavepoints.
// Dead-letter rows are written in the same transaction. A *batchError means
// nothing is known to have committed.
func (c *Consumer) processBatch(ctx context.Context, msgs []*Message, opts batchOptions) (_ []result, err error) {
	scope := opts.scope
	if scope == "" {
		scope = c.cfg.Name
	}
	careful := opts.savepoints || opts.readOnly || opts.rerun
	var deferred *idem.Deferred
	if !careful {
		deferred = &idem.Deferred{} // handlers' writes that can wait for the end of the batch
	}
	results := make([]result, len(msgs))
	ctxs := make([]context.Context, len(msgs))
	spans := make([]trace.Span, len(msgs))
	handlerCtx := ctx // what every handler's context derives from
	if deferred != nil {
		handlerCtx = idem.WithDeferred(ctx, deferred)
	}
	for i, m := range msgs {
		ctxs[i], spans[i] = c.tel.startSpan(handlerCtx, m, len(msgs))
		if opts.messageContext != nil {
			ctxs[i] = opts.messageContext(ctxs[i], m)
		}
	}
	defer func() {
		for i, span := range spans {
			r := results[i]
			if err != nil {
				r = result{outcome: outcomeUnresolved, err: err}
			}
			endSpan(span, r)
		}
	}()
	c.tel.batch(ctx, len(msgs))
	txOpts := pgx.TxOptions{}
	if opts.readOnly {
		txOpts.AccessMode = pgx.ReadOnly
	}
	tx, err := c.cfg.Pool.BeginTx(ctx, txOpts)
	if err != nil {
		return nil, &batchError{err: fmt.Errorf("begin: %w", err)}
	}
	ended := false
	defer func() {
		if !ended {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if opts.asyncCommit {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return nil, &batchError{err: fmt.Errorf("async commit: %w", err)}
		}
	}

	claims := make([]inbox.Claim, 0, len(msgs))
	index := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if opts.only != nil && !opts.only(m) {
			results[i] = result{outcome: outcomeSkipped} // not selected: untouched, even if invalid
			continue
		}
		if m.deadLetter != nil {
			results[i] = result{outcome: outcomeDeadLettered, reason: m.deadLetter.Reason, err: m.deadLetter.Err}
			continue
		}
		cl := inbox.Claim{Consumer: scope, MessageID: m.ID, PayloadHash: m.Hash, BusinessKey: m.BusinessKey, Source: m.Source}
		if m.HasOffset {
			cl.StreamOffset = &m.Offset
		}
		claims = append(claims, cl)
		index = append(index, i)
	}
	decisions, err := c.decide(ctx, tx, claims, opts)
	if errors.Is(err, inbox.ErrClaimed) {
		return nil, errAlreadyClaimed
	}
	if err != nil {
		return nil, &batchError{err: err, contention: isContention(err)}
	}
	htx := handlerTx{tx}
	savepoint := false
	var together []int // with a batch handler: the messages it runs at once
	rerunIDs := map[string]bool{}
	stopAt := -1 // index of the first retried message, with stopAtRetry
	for j, d := range decisions {
		i := index[j]
		m := msgs[i]
		if stopAt >= 0 {
			results[i] = result{outcome: outcomeDeferred}
			if d.Decision == inbox.NewMessage && !opts.readOnly {
				if err := c.inbox.Unclaim(ctx, tx, scope, m.ID); err != nil {
					return nil, &batchError{err: err, contention: isContention(err)}
				}
			}
			continue
		}
		results[i].inbox = d.Decision
		if d.Decision == inbox.Conflict {
			results[i].storedHash = d.StoredHash
		}
		rerun := opts.rerun && d.Decision == inbox.Duplicate && !rerunIDs[m.ID]
		if rerun {
			rerunIDs[m.ID] = true // a second copy in the batch is a duplicate of this run
		}
		run := d.Decision == inbox.NewMessage || opts.readOnly || rerun
		if !run {
			if d.Decision == inbox.Duplicate {
				results[i].outcome = outcomeDuplicate
			} else {
				results[i] = result{outcome: outcomeDeadLettered, reason: ReasonPayloadConflict, storedHash: d.StoredHash, inbox: d.Decision,
					err: fmt.Errorf("message id reused with payload hash %s, inbox holds %s", m.Hash, d.StoredHash)}
			}
			continue
		}
		if !careful && c.batch != nil && opts.messageContext == nil {
			together = append(together, i)
			continue
		}
		if careful {
			stmt := "SAVEPOINT idem_message"
			if savepoint {
				stmt = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message"
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return nil, &batchError{err: fmt.Errorf("savepoint: %w", err)}
			}
			savepoint = true
		}
		start := time.Now()
		herr := c.callHandler(ctxs[i], htx, m)
		c.tel.handlerTime(ctx, time.Since(start))
		if herr == nil && tx.Conn().PgConn().TxStatus() == 'E' {
			// The handler swallowed a failed statement: its work is not there.
			herr = errAbortedByHandler
		}
		if herr == nil {
			results[i].outcome = outcomeProcessed
			continue
		}
		if isContention(herr) && !opts.readOnly {
			return nil, &batchError{err: fmt.Errorf("message %s: %w", shortID(m.ID), herr), contention: true}
		}
		if !careful {
			// Without savepoints the failure cannot be undone alone: run
			// the batch again, this time with a savepoint per message.
			return nil, errNeedSavepoints
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT idem_message"); err != nil {
			return nil, &batchError{err: fmt.Errorf("rollback to savepoint after handler error %v: %w", herr, err)}
		}
		if d.Decision == inbox.NewMessage && !opts.readOnly {
			if err := c.inbox.Unclaim(ctx, tx, scope, m.ID); err != nil {
				return nil, &batchError{err: err, contention: isContention(err)}
			}
		}
		r := c.classify(m, herr)
		r.inbox, r.storedHash = d.Decision, results[i].storedHash
		results[i] = r
		if r.outcome == outcomeRetry && opts.stopAtRetry {
			stopAt = i
		}
	}
	if stopAt >= 0 {
		// Invalid messages after the stop are dead-lettered when their turn comes.
		for i := stopAt + 1; i < len(msgs); i++ {
			if results[i].outcome == outcomeDeadLettered {
				results[i] = result{outcome: outcomeDeferred}
			}
		}
	}
	if len(together) > 0 {
		batch := make([]*Message, len(together))
		for k, i := range together {
			batch[k] = msgs[i]
		}
		start := time.Now()
		herr := c.callBatchHandler(handlerCtx, htx, batch)
		c.tel.handlerTime(ctx, time.Since(start))
		if herr == nil && tx.Conn().PgConn().TxStatus() == 'E' {
			herr = errAbortedByHandler
		}
		if herr != nil {
			if isContention(herr) {
				return nil, &batchError{err: fmt.Errorf("batch handler: %w", herr), contention: true}
			}
			return nil, errNeedSavepoints // message by message, to find the culprit
		}
		for _, i := range together {
			results[i].outcome = outcomeProcessed
		}
	}
	if opts.readOnly {
		return results, nil // the deferred rollback ends the transaction
	}
	if deferred != nil {
		if err := deferred.Flush(ctx, tx); err != nil {
			if isContention(err) {
				return nil, &batchError{err: err, contention: true}
			}
			// A deferred write failed (an effect conflict, say): run the
			// batch again with immediate writes, so the error reaches the
			// handler that caused it.
			return nil, errNeedSavepoints
		}
	}
	if err := c.insertDeadLetters(ctx, tx, scope, msgs, results); err != nil {
		return nil, &batchError{err: err, contention: isContention(err)}
	}
	if opts.beforeCommit != nil {
		if err := opts.beforeCommit(ctx, tx, msgs, results); err != nil {
			return nil, &batchError{err: err, contention: isContention(err)}
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	start := time.Now()
	err = tx.Commit(cctx)
	c.tel.commitTime(ctx, time.Since(start))
	ended = true // committed or failed: either way the tx is over
	if err != nil {
		return nil, &batchError{err: fmt.Errorf("commit: %w", err), contention: isContention(err)}
	}
	c.counts.batches.Add(1)
	if opts.committed != nil {
		opts.committed(msgs, results)
	}
	if opts.afterCommit != nil {
		opts.afterCommit()
	}
	return results, nil
}

// decide claims the messages in the inbox, or, read-only, looks them up.
func (c *Consumer) decide(ctx context.Context, tx pgx.Tx, claims []inbox.Claim, opts batchOptions) ([]inbox.Result, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	switch {
	case opts.readOnly:
	case opts.newClaims && !opts.savepoints && !opts.rerun:
		return c.inbox.ClaimNewBatch(ctx, tx, claims)
	default:
		return c.inbox.ClaimBatch(ctx, tx, claims)
	}
	out := make([]inbox.Result, len(claims))
	for i, cl := range claims {
		rec, err := c.inbox.Lookup(ctx, tx, cl.Consumer, cl.MessageID)
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

// errNeedSavepoints abandons an optimistic batch whose handler failed.
var errNeedSavepoints = errors.New("consumer: a handler failed; run the batch with savepoints")

// errAlreadyClaimed abandons a batch claimed with ClaimNewBatch that holds a
// message the inbox has already.
var errAlreadyClaimed = errors.New("consumer: a message of the batch is in the inbox; claim it with ClaimBatch")

// classicClaimBatches is how many batches claim with ClaimBatch after one
// met a message the inbox had already: duplicates tend to come in runs.
const classicClaimBatches = 16

// processFallback runs msgs once the cheapest way that works: claims with a
// plain INSERT unless a batch recently met a duplicate, handlers without
// savepoints unless one recently failed. A batch that meets a duplicate runs
// again with ClaimBatch; one whose handler fails runs again with a savepoint
// per message.
func (c *Consumer) processFallback(ctx context.Context, msgs []*Message, opts batchOptions) ([]result, error) {
	if !opts.savepoints && !opts.readOnly && !opts.rerun {
		if c.classicClaims.Load() > 0 {
			c.classicClaims.Add(-1)
		} else {
			opts.newClaims = true
		}
	}
	res, err := c.processBatch(ctx, msgs, opts)
	if errors.Is(err, errAlreadyClaimed) {
		c.classicClaims.Store(classicClaimBatches)
		opts.newClaims = false
		res, err = c.processBatch(ctx, msgs, opts)
	}
	if errors.Is(err, errNeedSavepoints) {
		c.careful.Store(carefulBatches)
		opts.savepoints, opts.newClaims = true, false
		res, err = c.processBatch(ctx, msgs, opts)
	}
	return res, err
}

// errAbortedByHandler is the error of a handler that returned nil although
// one of its statements failed and aborted the transaction.
var errAbortedByHandler = errors.New("handler returned nil, but a statement it ran failed and aborted the transaction")

// carefulBatches is how many batches run with savepoints after a handler
// failed in an optimistic one: failures tend to come in runs.
const carefulBatches = 16

// classify turns a handler error into a dead letter or a retry.
func (c *Consumer) classify(m *Message, herr error) result {
	if reason, ok := deadLetterReason(herr); ok {
		return result{outcome: outcomeDeadLettered, reason: reason, err: herr}
	}
	if m.Attempt >= c.cfg.MaxAttempts {
		return result{outcome: outcomeDeadLettered, reason: ReasonMaxAttempts,
			err: fmt.Errorf("attempt %d of %d: %w", m.Attempt, c.cfg.MaxAttempts, herr)}
	}
	return result{outcome: outcomeRetry, err: herr}
}

// callHandler runs the handler and turns a panic into a *PanicError.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
			c.cfg.Logger.Error("handler panicked", "consumer", c.cfg.Name, "message_id", shortID(m.ID),
				"panic", fmt.Sprint(v), "stack", string(err.(*PanicError).Stack))
		}
	}()
	return c.handler(ctx, tx, m)
}

// callBatchHandler runs the batch handler and turns a panic into a *PanicError.
func (c *Consumer) callBatchHandler(ctx context.Context, tx pgx.Tx, msgs []*Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
			c.cfg.Logger.Error("batch handler panicked", "consumer", c.cfg.Name, "messages", len(msgs),
				"panic", fmt.Sprint(v), "stack", string(err.(*PanicError).Stack))
		}
	}()
	return c.batch(ctx, tx, msgs)
}

// runBatch processes msgs, retrying the whole batch after database failures
// with capped backoff. A batch that keeps failing is split in halves (at once
// for deadlocks and serialization failures, which concurrent batches cause),
// down to single messages. A single message whose transaction keeps failing
// while the database answers is given up (unresolved: back to the broker,
// whose delivery limit ends a poison message); while the database does not
// answer, it is retried until it does or the batch is abandoned (shutdown
// deadline, or its broker session died).
func (c *Consumer) runBatch(ctx context.Context, msgs []*Message, opts batchOptions) []result {
	for attempt := 1; ; attempt++ {
		opts.savepoints = c.careful.Load() > 0
		if opts.savepoints {
			c.careful.Add(-1)
		}
		unlock := c.admit(attempt > 1)
		res, err := c.processFallback(ctx, msgs, opts)
		unlock()
		if err == nil {
			return res
		}
		var be *batchError
		contention := errors.As(err, &be) && be.contention
		if contention {
			c.serialUntil.Store(time.Now().Add(serialWindow).UnixNano())
		}
		c.cfg.Logger.Warn("batch failed, retrying", "consumer", c.cfg.Name, "size", len(msgs), "attempt", attempt,
			"contention", contention, "error", err)
		c.tel.batchRetry(ctx, contention)
		if ctx.Err() != nil || closed(opts.abandon) {
			return unresolved(len(msgs), err)
		}
		if len(msgs) > 1 && (attempt >= c.cfg.BatchRetries || (contention && attempt >= 2)) {
			half := len(msgs) / 2
			first := c.runBatch(ctx, msgs[:half], opts)
			if opts.inOrder && slices.ContainsFunc(first, func(r result) bool { return r.outcome == outcomeUnresolved }) {
				return append(first, unresolved(len(msgs)-half, err)...)
			}
			return append(first, c.runBatch(ctx, msgs[half:], opts)...)
		}
		if attempt >= c.cfg.BatchRetries && c.databaseAnswers(ctx) {
			return unresolved(len(msgs), err)
		}
		sleep(ctx, backoff(attempt, 50*time.Millisecond, 5*time.Second))
	}
}

// serialWindow is how long batches run one at a time after a deadlock or
// serialization failure between them.
const serialWindow = 10 * time.Second

// admit lets a batch run: alongside other batches normally, alone while
// batches recently deadlocked each other (handlers updating the same hot rows
// in different orders) and for a batch's own retries after such a failure.
// Each deadlock costs PostgreSQL's deadlock_timeout before it is detected;
// running alone for a while stops them from recurring at that price.
func (c *Consumer) admit(retry bool) (unlock func()) {
	if retry || time.Now().UnixNano() < c.serialUntil.Load() {
		c.parallel.Lock()
		return c.parallel.Unlock
	}
	c.parallel.RLock()
	return c.parallel.RUnlock
}

func unresolved(n int, err error) []result {
	out := make([]result, n)
	for i := range out {
		out[i] = result{outcome: outcomeUnresolved, err: err}
	}
	return out
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// databaseAnswers reports whether PostgreSQL answers a trivial query.
func (c *Consumer) databaseAnswers(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.cfg.Pool.Exec(pctx, "SELECT 1")
	return err == nil
}

// handlerTx is the transaction handlers get: the runtime owns commit and
// rollback, so the handler cannot end the batch's transaction.
type handlerTx struct{ pgx.Tx }

// errTxOwned is returned when a handler tries to end the batch transaction.
var errTxOwned = errors.New("consumer: the runtime owns the transaction; return an error instead of rolling back")

func (handlerTx) Commit(context.Context) error   { return errTxOwned }
func (handlerTx) Rollback(context.Context) error { return errTxOwned }

// shortID truncates a message id for logs: ids may carry business data.
func shortID(id string) string {
	if len(id) <= 24 {
		return id
	}
	return id[:24] + "…"
}
