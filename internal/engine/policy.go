package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/retry"
)

// classicClaimBatches is how many batches claim with ClaimBatch after one
// met a message the inbox had already: duplicates come in runs (a
// redelivery after a crash, a producer's retries).
const classicClaimBatches = 16

// carefulBatches is how many batches run with savepoints after a handler
// failed in an optimistic one: failures come in runs.
const carefulBatches = 16

// Once runs items as one batch, with the fallbacks of a single attempt (see
// once) and without retrying a failed transaction: the error says the
// transaction failed as a whole, and nothing of it is known to have
// committed. Process uses it.
func (e *Engine) Once(ctx context.Context, items []*Item, o Options) ([]Result, error) {
	fixed := make([]Result, len(items))
	for {
		res, err := e.once(ctx, items, &o, &plan{lockTimeout: e.cfg.LockTimeout, fixed: fixed})
		if ex, ok := errors.AsType[*excludeError](err); ok {
			fixed[ex.index] = ex.result // decided; the others run again without it
			continue
		}
		if err == nil && !o.ReadOnly {
			e.Count(ctx, res)
		}
		return res, err
	}
}

// Run processes items as one batch until its transaction commits, and
// returns each item's result. A failed transaction is retried with capped
// backoff; a batch that keeps failing is split in halves (at once when
// batches contend for rows), down to single items. A single item whose
// transaction still fails while the database answers is given up
// (Unresolved: back to its source); while the database does not answer, it
// is retried until it does, or until ctx ends or o.Abandon is closed. The
// caller counts the results (Count) once it has acted on them.
func (e *Engine) Run(ctx context.Context, items []*Item, o Options) []Result {
	return e.run(ctx, items, &o, make([]Result, len(items)), false)
}

// run is Run's loop; alone says the caller holds the engine alone.
func (e *Engine) run(ctx context.Context, items []*Item, o *Options, fixed []Result, alone bool) []Result {
	lock := e.cfg.LockTimeout
	for attempt := 1; ; attempt++ {
		release, serial, solo := func() {}, false, false
		if !alone {
			var ok bool
			if release, serial, solo, ok = e.gov.admit(ctx, o.Abandon); !ok {
				return unresolved(len(items), context.Cause(ctx))
			}
		}
		res, err := e.once(ctx, items, o, &plan{lockTimeout: lock, serial: serial, fixed: fixed})
		release()
		if ex, ok := errors.AsType[*excludeError](err); ok {
			fixed[ex.index] = ex.result // decided; the others run again without it
			e.gov.unprobe(serial)
			attempt--
			continue
		}
		be, _ := errors.AsType[*batchError](err)
		contention := be != nil && be.contention
		e.gov.done(contention, serial, solo || be != nil && be.foreign)
		if err == nil {
			return res
		}
		e.logRetry(ctx, len(items), attempt, contention, err)
		if ctx.Err() != nil || closed(o.Abandon) {
			return unresolved(len(items), err)
		}
		if contention {
			// The other transaction commits in milliseconds; wait longer
			// for it next time, and split a batch that conflicts again.
			lock = min(lock*4, max(e.cfg.HandlerTimeout, e.cfg.LockTimeout))
		}
		if len(items) > 1 && (attempt >= e.cfg.BatchRetries || contention && attempt >= 2) {
			return e.split(ctx, items, o, fixed, err, alone)
		}
		if attempt >= e.cfg.BatchRetries && e.databaseAnswers(ctx) {
			if e.giveUp(ctx, items[0], o, fixed, err) {
				continue // one more attempt writes its dead letter
			}
			return unresolved(len(items), err)
		}
		delay := retry.Backoff(attempt, 50*time.Millisecond, 5*time.Second)
		if contention {
			delay = retry.Backoff(attempt, 5*time.Millisecond, time.Second)
		}
		sleepUnlessAbandoned(ctx, delay, o.Abandon)
	}
}

// split runs the two halves of a failing batch; in order, the second half
// runs only if the first settled: after an unresolved message it is
// unresolved too, after a retried one it waits for it (Deferred).
func (e *Engine) split(ctx context.Context, items []*Item, o *Options, fixed []Result, err error, alone bool) []Result {
	half := len(items) / 2
	first := e.run(ctx, items[:half], o, fixed[:half], alone)
	if o.InOrder && slices.ContainsFunc(first, func(r Result) bool { return r.Outcome == Unresolved }) {
		return append(first, unresolved(len(items)-half, err)...)
	}
	if o.InOrder && slices.ContainsFunc(first, func(r Result) bool { return !r.Outcome.Final() }) {
		rest := make([]Result, len(items)-half)
		for i := range rest {
			rest[i] = Result{Outcome: Deferred}
		}
		return append(first, rest...)
	}
	return append(first, e.run(ctx, items[half:], o, fixed[half:], alone)...)
}

// giveUp decides what becomes of a single message whose transaction keeps
// failing while the database answers (a constraint that fails at commit,
// say). Tracked messages count a failed attempt in the attempts table, so
// that the redeliveries end: once the message reaches MaxAttempts, giveUp
// fixes its dead letter (reason max_attempts) and reports true, and the
// next attempt writes only that. Otherwise the message is handed back.
func (e *Engine) giveUp(ctx context.Context, it *Item, o *Options, fixed []Result, err error) bool {
	if len(fixed) != 1 || !o.TrackAttempts || it.Reject != nil || fixed[0].Outcome != 0 {
		return false
	}
	if it.Attempt >= e.cfg.MaxAttempts {
		fixed[0] = Result{Outcome: DeadLettered, Reason: deadletters.ReasonMaxAttempts,
			Err: fmt.Errorf("attempt %d of %d: its transaction kept failing: %w", it.Attempt, e.cfg.MaxAttempts, err)}
		return true
	}
	e.recordFailure(ctx, scopeOf(o, e), it)
	return false
}

// once runs items the cheapest way that works: claims with a plain INSERT
// unless a batch recently met a duplicate, handlers without savepoints
// unless one recently failed. A batch that meets a duplicate runs again with
// ClaimBatch; one whose handler fails runs again with a savepoint per item.
func (e *Engine) once(ctx context.Context, items []*Item, o *Options, p *plan) ([]Result, error) {
	p.savepoints = o.ReadOnly || o.Rerun || countDown(&e.careful)
	p.newClaims = !p.savepoints && !countDown(&e.classicClaims)
	res, err := e.supervised(ctx, items, o, p)
	if errors.Is(err, errAlreadyClaimed) {
		e.classicClaims.Store(classicClaimBatches)
		p.newClaims = false
		res, err = e.supervised(ctx, items, o, p)
	}
	if errors.Is(err, errNeedSavepoints) {
		e.careful.Store(carefulBatches)
		p.savepoints, p.newClaims = true, false
		res, err = e.supervised(ctx, items, o, p)
	}
	return res, err
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

// Count adds a batch's results to the counters and metrics. Sources call it
// once they have acted on the results (the broker was told).
func (e *Engine) Count(ctx context.Context, res []Result) {
	e.Counts.count(res)
	e.tel.outcomes(ctx, res)
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
