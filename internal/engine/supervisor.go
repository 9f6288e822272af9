package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/inflight"
)

// The supervisor: how one try of a batch runs, between the retry loop
// (run.go) and its transaction (attempt.go). The governor admits it; it runs
// the cheapest way that works (once), on a goroutine of its own (supervised)
// whose handler the supervisor abandons when it ignores its deadline
// (abandon; the watch it reads is the handler stage's, handlers.go); and
// the supervisor keeps the Vitals a consumer's health report reads.

// admitted runs items once (see once) when the governor admits them, and
// tells the governor how the try went; alone says the caller holds the
// engine alone (RunAlone), and is not admitted. A message excluded from the
// try (its handler timed out, or ended the transaction) is decided in
// fixed, and the others run again. ok is false when ctx ended or abandon
// closed before the governor admitted them.
func (e *Engine) admitted(ctx context.Context, items []*Item, p *rules, lock time.Duration, fixed []Result, alone bool) (res []Result, ok bool, err error) {
	for {
		serial, solo := false, false
		if !alone {
			if serial, solo, ok = e.gov.admit(ctx, p.abandon); !ok {
				return nil, false, nil
			}
		}
		res, err = e.once(ctx, items, p, &plan{lockTimeout: lock, serial: serial, fixed: fixed})
		if ex, excluded := errors.AsType[*excludeError](err); excluded {
			fixed[ex.index] = ex.result // decided; the others run again without it
			e.gov.excluded(!alone, serial)
			continue
		}
		be, _ := errors.AsType[*batchError](err)
		e.gov.done(!alone, be != nil && be.contention, serial, solo || be != nil && be.foreign)
		return res, true, err
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
	res, err := e.relaidOut(ctx, items, p, pl)
	if errors.Is(err, errAlreadyClaimed) {
		e.classicClaims.Store(classicClaimBatches)
		pl.newClaims = false
		res, err = e.relaidOut(ctx, items, p, pl)
	}
	if errors.Is(err, errNeedSavepoints) {
		e.careful.Store(carefulBatches)
		pl.savepoints, pl.newClaims = true, false
		res, err = e.relaidOut(ctx, items, p, pl)
	}
	return res, err
}

// relaidOut runs items (supervised), and once more when the claim met an
// inbox converted to the partitioned layout since the engine's Inbox last
// read it: the claim of the second try reads the layout again.
func (e *Engine) relaidOut(ctx context.Context, items []*Item, p *rules, pl *plan) ([]Result, error) {
	res, err := e.supervised(ctx, items, p, pl)
	if errors.Is(err, errLayoutChanged) {
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
			wait, late := w.overdue(now, e.cfg.HandlerTimeout, abandonGrace)
			if late != nil {
				e.keys.abandon(late.owner)
				return e.abandon(ctx, items, late.index, late.conn)
			}
			timer.Reset(max(wait, time.Millisecond))
		}
	}
}

// abandonGrace is how long a handler past its deadline may take to return
// before the engine abandons it. A handler that honours its context returns
// at once: pgx closes the connection of a statement whose context ends.
const abandonGrace = 2 * time.Second

// abandon takes the connection away from a handler that ignores its
// context: the pool forgets it (its slot is free again), its socket is
// closed so that the handler's next statement fails, and its backend is
// terminated, releasing every lock it holds even while a statement runs.
// The handler's message counts a failed attempt; the others run again.
func (e *Engine) abandon(ctx context.Context, items []*Item, index int, conn *pgxpool.Conn) ([]Result, error) {
	raw := conn.Hijack()
	pid := raw.PgConn().PID()
	// Terminate first, while the backend still serves this socket: once
	// the socket is closed, its pid may go to another session.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CommitTimeout)
	_, terr := e.cfg.Pool.Exec(tctx, "SELECT pg_terminate_backend($1)", int64(pid))
	cancel()
	_ = raw.PgConn().Conn().Close()
	e.Counts.Abandoned.Add(1)
	e.tel.abandoned(ctx)
	id := "(batch handler)"
	if index >= 0 {
		id = shortID(items[index].ID)
	}
	e.cfg.Logger.Error("handler ignored its context past its deadline: abandoned its transaction and goroutine",
		"message_id", id, "handler_timeout", e.cfg.HandlerTimeout, "grace", abandonGrace, "backend_pid", pid,
		"terminate_error", terr)
	if index < 0 {
		return nil, errNeedSavepoints // message by message, to find the culprit
	}
	return nil, &excludeError{index: index, result: e.classify(items[index], &idem.TimeoutError{Limit: e.cfg.HandlerTimeout, Abandoned: true})}
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
// running ones to finish, or while it runs (see exclusive and RunAlone).
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

// admit waits for a batch's turn, which done or excluded ends. serial says
// the batch must take the consumer's advisory lock, solo that it runs alone
// in this process. ok is false when ctx ended or abandon closed first.
func (g *governor) admit(ctx context.Context, abandon <-chan struct{}) (serial, solo, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.alone || g.waiting > 0 || g.running >= g.limit {
		if !g.wait(ctx, abandon) {
			return false, false, false
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
	return serial, solo, true
}

// leave ends an admitted batch's turn; mu must be held.
func (g *governor) leave() {
	g.running--
	g.wake()
}

// done records how a batch transaction ended, and ends its turn if it was
// admitted; serial says whether it held the consumer's batch lock
// exclusively, solo whether a conflict it met was with another process (it
// ran alone in this process, or its row was no other batch's here).
func (g *governor) done(admitted, contention, serial, solo bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if admitted {
		g.leave()
	}
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

// excluded ends the turn of a batch whose attempt ended without a verdict
// (a message was excluded from it); a probe that ended so probes again at
// the next admission.
func (g *governor) excluded(admitted, serial bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if admitted {
		g.leave()
	}
	if !serial && g.probing {
		g.probing = false
	}
}

// exclusive waits until no batch runs and holds the engine alone.
func (g *governor) exclusive(ctx context.Context, abandon <-chan struct{}) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiting++
	for g.alone || g.running > 0 {
		if !g.wait(ctx, abandon) {
			g.waiting--
			g.wake()
			return nil, false
		}
	}
	g.waiting--
	g.alone = true
	return func() {
		g.mu.Lock()
		g.alone = false
		g.wake()
		g.mu.Unlock()
	}, true
}

// Vitals is what a consumer's health report reads. The source sets whether
// it runs and is connected; the supervisor records the attempts' progress.
type Vitals struct {
	// Running reports that the source's Run is running.
	Running atomic.Bool
	// Connected reports that the source is connected and consuming (a
	// queue), or reading or standing by (a stream).
	Connected atomic.Bool
	// Trouble says why the source is not connected, when it knows.
	Trouble atomic.Pointer[string]
	// Stopped says why Run returned with an error.
	Stopped atomic.Pointer[string]

	active   atomic.Int64 // attempts in flight
	progress atomic.Int64 // when an attempt last moved (Unix ns)
	// failing is when the transactions of the current streak of failed
	// attempts began failing (Unix ns), 0 when the last one committed;
	// failure is the last one's error.
	failing atomic.Int64
	failure atomic.Pointer[string]

	// calls are the runtime's own database calls in flight (see
	// batch.bounded).
	calls inflight.Calls
}

// Unanswered reports how long the oldest of the runtime's database calls
// in flight has waited for an answer, when it has waited longer than its
// lock wait plus limit: the connection it runs on reaches a database that
// stopped answering (a frozen primary, a blackholed link), whatever a
// probe over a connection of its own finds. Batches cannot commit until
// the call fails, which takes up to the commit timeout.
func (v *Vitals) Unanswered(limit time.Duration) (time.Duration, bool) {
	return v.calls.Late(limit)
}

// Failing reports how long the transactions of the attempts have failed
// without one committing, when that is longer than limit, and the last
// failure: the database is away, read-only, or refuses the batches.
func (v *Vitals) Failing(limit time.Duration) (time.Duration, string, bool) {
	since := v.failing.Load()
	if since == 0 {
		return 0, "", false
	}
	d := time.Since(time.Unix(0, since))
	why := ""
	if p := v.failure.Load(); p != nil {
		why = *p
	}
	return d, why, d > limit
}

// SetTrouble records why the source is not connected ("" clears it).
func (v *Vitals) SetTrouble(why string) { v.Trouble.Store(&why) }

// Stalled reports how long attempts in flight have made no progress, when
// that is longer than limit: the engine is wedged, or every attempt fails.
func (v *Vitals) Stalled(limit time.Duration) (time.Duration, bool) {
	if v.active.Load() == 0 {
		return 0, false
	}
	d := time.Since(time.Unix(0, v.progress.Load()))
	return d, d > limit
}

// moved records that an attempt made progress: it committed, or one of its
// handlers returned.
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

// left records that work watched like an attempt (see started) ended
// without a verdict: neither progress nor a failure.
func (v *Vitals) left() { v.active.Add(-1) }

// StallLimit is how long attempts may go without progress before the
// engine counts as wedged: longer than any one handler may run (its
// timeout, then the grace before it is abandoned) plus a commit.
func (e *Engine) StallLimit() time.Duration {
	return e.cfg.HandlerTimeout + abandonGrace + e.cfg.CommitTimeout + 5*time.Second
}

// Started marks the source running and probes the database (Engine.DB)
// until the returned function is called, with the source's final error,
// when the source's Run returns.
func (e *Engine) Started(ctx context.Context) (stopped func(err error)) {
	e.Vitals.Running.Store(true)
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { // owned by the source's Run: stopped below
		defer close(done)
		e.DB.Run(pctx)
	}()
	return func(err error) {
		cancel()
		<-done
		e.Vitals.Running.Store(false)
		if err != nil {
			why := err.Error()
			e.Vitals.Stopped.Store(&why)
		}
	}
}

// AnswerLimit is how long the database may leave one of the runtime's own
// calls unanswered, beyond the lock wait the call may take, before the
// consumer reports itself not ready (see Vitals.Unanswered): about the
// database probe's timeout, so that a connection that stopped answering
// is seen as soon as a host that stopped answering is.
const AnswerLimit = 3 * time.Second

// FailingLimit is how long the batch transactions may fail one after
// another before the consumer reports itself not ready: long enough for a
// lock conflict or a failover to resolve, short enough for a load balancer
// or an operator to see a worker that cannot write.
const FailingLimit = 10 * time.Second
