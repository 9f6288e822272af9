package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/retry"
)

// Queue is a queue's policy. A failed message's attempts are counted in the
// attempts table; it waits in the consumer's retry queue, or, with an
// ordering key, in its source's process (see Ordered). Without an ordering
// key a message whose first write names a row another batch in flight wrote
// leaves its batch (Postponed) instead of waiting for that batch's locks.
type Queue struct {
	// Ordered says the queue has an ordering key (Item.Key): no message is
	// postponed, so none runs after a later message of its key, and once a
	// message is to be retried (or is Unresolved after a split), its key's
	// later messages in the batch are Held, unclaimed: the source retries
	// them in order.
	Ordered bool
	// Abandon, when closed, stops the retries of a failing batch: its broker
	// session died, and its messages are redelivered anyway.
	Abandon <-chan struct{}
	// AfterCommit, when set, runs once each commit returned (tests simulate
	// a crash there).
	AfterCommit func()
}

// rules are q's rules.
func (q Queue) rules(e *Engine) rules {
	return rules{scope: e.cfg.Name, retryQueue: true, postpone: !q.Ordered, byKey: q.Ordered, abandon: q.Abandon,
		afterCommit: q.AfterCommit}
}

// Run processes items as one batch until its transaction commits, and
// returns each item's result. A failed transaction is retried with capped
// backoff; a batch that keeps failing is split in halves (at once when
// batches contend for rows), down to single items. A single item whose
// transaction still fails while the database answers is given up
// (Unresolved: back to its source); while the database does not answer, it
// is retried until it does, or until ctx ends or q.Abandon is closed. The
// caller counts the results (Count) once it has acted on them.
func (e *Engine) Run(ctx context.Context, items []*Item, q Queue) []Result {
	r := q.rules(e)
	return e.run(ctx, items, &r, make([]Result, len(items)), false)
}

// RunWithoutRetries runs items as one batch, with the fallbacks of a
// single attempt (see once), and does not retry a failed transaction: the
// error says the transaction failed as a whole, and nothing of it is known
// to have committed. A message that had to be excluded (its handler timed
// out, or ended the transaction) is decided, and the others run again
// without it. consumer.Process uses it; it counts the results.
func (e *Engine) RunWithoutRetries(ctx context.Context, items []*Item) ([]Result, error) {
	r := processRules(e)
	return e.runWithoutRetries(ctx, items, &r)
}

// runWithoutRetries is RunWithoutRetries with rules p.
func (e *Engine) runWithoutRetries(ctx context.Context, items []*Item, p *rules) ([]Result, error) {
	fixed := make([]Result, len(items))
	for {
		res, err := e.once(ctx, items, p, &plan{lockTimeout: e.cfg.LockTimeout, fixed: fixed})
		if ex, ok := errors.AsType[*excludeError](err); ok {
			fixed[ex.index] = ex.result // decided; the others run again without it
			continue
		}
		if err == nil && p.inbox != inboxLook {
			e.Count(ctx, res)
		}
		return res, err
	}
}

// processRules are consumer.Process's rules: claim and run, nothing more.
func processRules(e *Engine) rules { return rules{scope: e.cfg.Name} }

// run is Run's loop; alone says the caller holds the engine alone.
func (e *Engine) run(ctx context.Context, items []*Item, p *rules, fixed []Result, alone bool) []Result {
	lock := e.cfg.LockTimeout
	for attempt := 1; ; attempt++ {
		res, ok, err := e.admitted(ctx, items, p, lock, fixed, alone)
		if !ok {
			return unresolved(len(items), context.Cause(ctx))
		}
		if err == nil {
			return res
		}
		be, _ := errors.AsType[*batchError](err)
		contention := be != nil && be.contention
		if _, stop := errors.AsType[*stopError](err); stop {
			return unresolved(len(items), err)
		}
		if ctx.Err() != nil || closed(p.abandon) {
			// Stopping, not retrying: the messages go back to their source.
			e.cfg.Logger.Debug("batch stopped by shutdown; its messages go back to their source",
				"size", len(items), "error", err)
			return unresolved(len(items), err)
		}
		e.logRetry(ctx, len(items), attempt, contention, err)
		if contention {
			// The other transaction commits in milliseconds; wait longer
			// for it next time, and split a batch that conflicts again.
			lock = min(lock*4, max(e.cfg.HandlerTimeout, e.cfg.LockTimeout))
		}
		if len(items) > 1 && (attempt >= e.cfg.BatchRetries || contention && attempt >= 2) {
			return e.split(ctx, items, p, fixed, err, alone)
		}
		if attempt >= e.cfg.BatchRetries && e.databaseAnswers(ctx) {
			if e.giveUp(ctx, items[0], p, fixed, err) {
				continue // one more attempt writes its dead letter
			}
			return unresolved(len(items), err)
		}
		delay := retry.Backoff(attempt, 50*time.Millisecond, 5*time.Second)
		if contention {
			delay = retry.Backoff(attempt, 5*time.Millisecond, time.Second)
		}
		sleepUnlessAbandoned(ctx, delay, p.abandon)
	}
}

// split runs the two halves of a failing batch; in order, the second half
// runs only if the first settled: after an unresolved message it is
// unresolved too, after a retried one it waits for it (Held). By key, only
// the second half's items of a key that did not settle in the first wait
// (Held).
func (e *Engine) split(ctx context.Context, items []*Item, p *rules, fixed []Result, err error, alone bool) []Result {
	half := len(items) / 2
	first := e.run(ctx, items[:half], p, fixed[:half], alone)
	if p.byKey {
		holdBehind(items, first, fixed)
	}
	if p.inOrder && slices.ContainsFunc(first, func(r Result) bool { return r.Outcome == idem.Unresolved }) {
		return append(first, unresolved(len(items)-half, err)...)
	}
	if p.inOrder && slices.ContainsFunc(first, func(r Result) bool { return !r.Outcome.Final() }) {
		rest := make([]Result, len(items)-half)
		for i := range rest {
			rest[i] = Result{Outcome: idem.Held}
		}
		return append(first, rest...)
	}
	return append(first, e.run(ctx, items[half:], p, fixed[half:], alone)...)
}

// holdBehind fixes as Held the items after first, the results of the
// first items, whose key has an item there that did not settle: they run
// after it.
func holdBehind(items []*Item, first, fixed []Result) {
	var keys map[string]bool
	for i, r := range first {
		if !r.Outcome.Final() {
			if keys == nil {
				keys = map[string]bool{}
			}
			keys[items[i].Key] = true
		}
	}
	for i := len(first); i < len(items) && keys != nil; i++ {
		if keys[items[i].Key] && (fixed[i].Outcome == 0 || fixed[i].Outcome.Final()) {
			fixed[i] = Result{Outcome: idem.Held}
		}
	}
}

// giveUp decides what becomes of a single message whose transaction keeps
// failing while the database answers (a constraint that fails at commit,
// say). A message with a retry queue counts a failed attempt in the
// attempts table, so that the redeliveries end: once the message reaches
// MaxAttempts, giveUp fixes its dead letter (reason max_attempts) and
// reports true, and the next attempt writes only that. Otherwise the
// message is handed back.
func (e *Engine) giveUp(ctx context.Context, it *Item, p *rules, fixed []Result, err error) bool {
	if len(fixed) != 1 || !p.retryQueue || it.Reject != nil || fixed[0].Outcome != 0 {
		return false
	}
	if it.Attempt >= e.cfg.MaxAttempts {
		fixed[0] = Result{Outcome: idem.DeadLettered, Reason: deadletters.ReasonMaxAttempts,
			Err: fmt.Errorf("attempt %d of %d: its transaction kept failing: %w", it.Attempt, e.cfg.MaxAttempts, err)}
		return true
	}
	e.recordFailure(ctx, p.scope, it)
	return false
}

// logRetry logs and counts a failed batch transaction. Contention is
// expected under load and costs milliseconds: it is logged at Debug.
func (e *Engine) logRetry(ctx context.Context, size, attempt int, contention bool, err error) {
	e.tel.batchRetry(ctx, contention)
	level := e.cfg.Logger.Warn
	if contention {
		e.Counts.Contention.Add(1)
		level = e.cfg.Logger.Debug
	}
	level("batch failed, retrying", "size", size, "attempt", attempt, "contention", contention, "error", err)
}

// databaseAnswers reports whether PostgreSQL answers a trivial query.
func (e *Engine) databaseAnswers(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.cfg.Pool.Exec(pctx, "SELECT 1")
	return err == nil
}

// sleepUnlessAbandoned waits d, or less if ctx ends or abandon closes.
func sleepUnlessAbandoned(ctx context.Context, d time.Duration, abandon <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-abandon:
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
