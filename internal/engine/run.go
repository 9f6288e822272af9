package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/retry"
)

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

// run is Run's loop; alone says the caller holds the engine alone.
func (e *Engine) run(ctx context.Context, items []*Item, p *rules, fixed []Result, alone bool) []Result {
	lock := e.cfg.LockTimeout
	for attempt := 1; ; attempt++ {
		release, serial, solo := func() {}, false, false
		if !alone {
			var ok bool
			if release, serial, solo, ok = e.gov.admit(ctx, p.abandon); !ok {
				return unresolved(len(items), context.Cause(ctx))
			}
		}
		res, err := e.once(ctx, items, p, &plan{lockTimeout: lock, serial: serial, fixed: fixed})
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
		if _, stop := errors.AsType[*stopError](err); stop {
			return unresolved(len(items), err)
		}
		e.logRetry(ctx, len(items), attempt, contention, err)
		if ctx.Err() != nil || closed(p.abandon) {
			return unresolved(len(items), err)
		}
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

// classicClaimBatches is how many batches claim with ClaimBatch after one
// met a message the inbox had already: duplicates come in runs (a
// redelivery after a crash, a producer's retries).
const classicClaimBatches = 16

// carefulBatches is how many batches run with savepoints after a handler
// failed in an optimistic one: failures come in runs.
const carefulBatches = 16

// once runs items the cheapest way that works: claims with a plain INSERT
// unless a batch recently met a duplicate, handlers without savepoints
// unless one recently failed. A batch that meets a duplicate runs again with
// ClaimBatch; one whose handler fails runs again with a savepoint per item.
func (e *Engine) once(ctx context.Context, items []*Item, p *rules, pl *plan) ([]Result, error) {
	pl.savepoints = p.inbox != inboxClaim || countDown(&e.careful)
	pl.newClaims = !pl.savepoints && !countDown(&e.classicClaims)
	res, err := e.supervised(ctx, items, p, pl)
	if errors.Is(err, errAlreadyClaimed) {
		e.classicClaims.Store(classicClaimBatches)
		pl.newClaims = false
		res, err = e.supervised(ctx, items, p, pl)
	}
	if errors.Is(err, errNeedSavepoints) {
		e.careful.Store(carefulBatches)
		pl.savepoints, pl.newClaims = true, false
		res, err = e.supervised(ctx, items, p, pl)
	}
	return res, err
}

// countDown decrements a positive counter and reports whether it was positive.
func countDown(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

type attemptResult struct {
	results []Result
	err     error
}

// supervised runs one attempt on a goroutine of its own and waits for it.
// It ends the context of a handler that runs past HandlerTimeout; a
// handler still running abandonGrace after that ignores its context: the
// attempt is abandoned (see abandon) and the goroutine left to finish on
// its own, so that the worker goes on.
func (e *Engine) supervised(ctx context.Context, items []*Item, p *rules, pl *plan) (_ []Result, err error) {
	w := &watch{}
	defer w.finish()
	e.Vitals.started()
	defer func() { e.Vitals.ended(err) }()
	done := make(chan attemptResult, 1)
	go func() { // owned by the attempt; abandoned only with its handler
		res, err := e.attempt(ctx, items, p, pl, w)
		done <- attemptResult{res, err}
	}()
	timer := time.NewTimer(e.cfg.HandlerTimeout)
	defer timer.Stop()
	for {
		select {
		case r := <-done:
			return r.results, r.err
		case now := <-timer.C:
			index, wait, abandon := w.overdue(now, e.cfg.HandlerTimeout, abandonGrace)
			if abandon {
				e.keys.abandon(w.owner)
				return e.abandon(ctx, items, index, w.conn)
			}
			timer.Reset(max(wait, time.Millisecond))
		}
	}
}

// moved records that an attempt made progress.
func (v *Vitals) moved() { v.progress.Store(time.Now().UnixNano()) }

// started records that an attempt starts: work that starts after a quiet
// spell starts the stall clock, unless attempts are failing (a retry after
// a failure is not progress).
func (v *Vitals) started() {
	if v.active.Add(1) == 1 && v.failing.Load() == 0 {
		v.moved()
	}
}

// ended records how an attempt ended: one that committed is progress and
// ends a streak of failures; one whose transaction failed as a whole starts
// or continues it. Other errors (a handler that failed, one item excluded)
// are neither.
func (v *Vitals) ended(err error) {
	v.active.Add(-1)
	if err == nil {
		v.failing.Store(0)
		v.moved()
		return
	}
	_, stopped := errors.AsType[*stopError](err) // the source's decision, not a failing database
	if _, ok := errors.AsType[*batchError](err); ok && !stopped {
		v.failing.CompareAndSwap(0, time.Now().UnixNano())
		why := err.Error()
		v.failure.Store(&why)
	}
}

// split runs the two halves of a failing batch; in order, the second half
// runs only if the first settled: after an unresolved message it is
// unresolved too, after a retried one it waits for it (Held).
func (e *Engine) split(ctx context.Context, items []*Item, p *rules, fixed []Result, err error, alone bool) []Result {
	half := len(items) / 2
	first := e.run(ctx, items[:half], p, fixed[:half], alone)
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

// governor admits batches. Up to limit run at once: limit halves when
// batches contend for rows (each conflict is a retry) and grows by one after
// a run of limit batches without contention, up to MaxConcurrency, so that
// concurrency backs off only as much as contention demands and recovers in
// a few batches.
//
// Contention that goes on while only one batch runs in this process comes
// from other processes with the same consumer: the governor then serializes
// its batches across processes too — each takes a transaction-scoped
// advisory lock of the consumer first, so batches of every process queue on
// it instead of timing out on each other's rows — and after a while it
// tries a batch without it, staying serialized if that one conflicts.
//
// A suspect message runs alone: no batch is admitted while it waits for the
// running ones to finish, or while it runs (see exclusive, isolate.go).
type governor struct {
	mu      sync.Mutex
	max     int
	limit   int
	running int
	alone   bool // a suspect runs
	waiting int  // suspects waiting to run alone
	streak  int  // batches without contention since limit last changed
	// serialUntil, when in the future, serializes batches across processes;
	// at that time one batch probes without the lock.
	serialUntil time.Time
	probing     bool
	// probeAfter is how long batches stay serialized before the next probe:
	// it doubles with each probe that conflicts, and each time batches
	// serialize again soon after a probe went through (the others were
	// serialized, not the contention gone), up to maxProbeAfter.
	probeAfter time.Duration
	// parallelSince is when the last probe went through.
	parallelSince time.Time
	changed       chan struct{}
	// Limit mirrors limit for telemetry and Stats.
	Limit atomic.Int64
}

// How long batches stay serialized across processes before one tries
// without the lock: a probe that conflicts costs a lock timeout and a retry,
// so while contention lasts they come rarer.
const (
	minProbeAfter = 2 * time.Second
	maxProbeAfter = 30 * time.Second
)

func newGovernor(n int) *governor {
	n = max(n, 1)
	g := &governor{max: n, limit: n, changed: make(chan struct{})}
	g.Limit.Store(int64(n))
	return g
}

// wake tells every waiter that something changed; mu must be held.
func (g *governor) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait releases mu until something changes, ctx ends or abandon closes; it
// reports whether to go on, with mu held again.
func (g *governor) wait(ctx context.Context, abandon <-chan struct{}) bool {
	ch := g.changed
	g.mu.Unlock()
	defer g.mu.Lock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	case <-abandon:
		return false
	}
}

// admit waits for a batch's turn; release ends it. serial says the batch
// must take the consumer's advisory lock. ok is false when ctx ended or
// abandon closed first.
func (g *governor) admit(ctx context.Context, abandon <-chan struct{}) (release func(), serial, solo, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.alone || g.waiting > 0 || g.running >= g.limit {
		if !g.wait(ctx, abandon) {
			return nil, false, false, false
		}
	}
	g.running++
	// Alone in this process while it runs: nothing else is running, and
	// nothing else is admitted until it ends.
	solo = g.running == 1 && g.limit == 1
	serial = !g.serialUntil.IsZero()
	if serial && !g.probing && time.Now().After(g.serialUntil) {
		g.probing, serial = true, false // this one tries without the lock
	}
	return g.leave, serial, solo, true
}

func (g *governor) leave() {
	g.mu.Lock()
	g.running--
	g.wake()
	g.mu.Unlock()
}

// done records how a batch transaction ended; serial says whether it held
// the consumer's batch lock exclusively, solo whether a conflict it met was
// with another process (it ran alone in this process, or its row was no
// other batch's here).
func (g *governor) done(contention, serial, solo bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !serial && g.probing {
		g.probing = false
		if contention {
			g.probeAfter = min(2*g.probeAfter, maxProbeAfter)
			g.serialUntil = time.Now().Add(g.probeAfter)
		} else {
			g.serialUntil = time.Time{} // the probe went through: parallel again
			g.parallelSince = time.Now()
		}
	}
	switch {
	case contention && solo && !serial:
		if time.Since(g.parallelSince) < 2*maxProbeAfter {
			g.probeAfter = min(2*max(g.probeAfter, minProbeAfter), maxProbeAfter) // back soon: the contention lasts
		} else {
			g.probeAfter = minProbeAfter
		}
		g.serialUntil = time.Now().Add(g.probeAfter) // conflicts with other processes
		g.streak = 0
	case contention:
		g.limit = max(1, g.limit/2)
		g.streak = 0
	case g.limit < g.max:
		g.streak++
		if g.streak >= g.limit {
			g.limit++
			g.streak = 0
			g.wake()
		}
	}
	g.Limit.Store(int64(g.limit))
}

// unprobe ends a probe whose attempt ended without a verdict (a message was
// excluded from it): the next admission probes again.
func (g *governor) unprobe(serial bool) {
	g.mu.Lock()
	if !serial && g.probing {
		g.probing = false
	}
	g.mu.Unlock()
}
