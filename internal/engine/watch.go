package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// abandonGrace is how long a handler past its deadline may take to return
// before the engine abandons it. A handler that honours its context returns
// at once: pgx closes the connection of a statement whose context ends.
const abandonGrace = 2 * time.Second

// errHandlerDeadline is the cause of a handler context that ran out.
var errHandlerDeadline = errors.New("handler deadline")

// errAbandoned ends an attempt whose handler returned after it was abandoned.
var errAbandoned = errors.New("engine: the handler returned after it was abandoned")

// watch is what the supervisor of an attempt knows about it: which handler
// runs, since when, and whether the attempt was abandoned. The attempt's
// goroutine owns its connection except while a handler runs; the
// supervisor may take it then, and only then.
type watch struct {
	mu        sync.Mutex
	conn      *pgxpool.Conn
	owner     *batch
	inHandler bool
	index     int // the item whose handler runs; -1 for the batch handler
	started   time.Time
	abandoned bool
}

func (w *watch) hold(conn *pgxpool.Conn, b *batch) {
	w.mu.Lock()
	w.conn, w.owner = conn, b
	w.mu.Unlock()
}

func (w *watch) enter(index int) {
	w.mu.Lock()
	w.inHandler, w.index, w.started = true, index, time.Now()
	w.mu.Unlock()
}

// leave reports whether the attempt is still the goroutine's to finish.
func (w *watch) leave() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inHandler = false
	return !w.abandoned
}

// release reports whether the connection is still the attempt's to release.
func (w *watch) release() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.abandoned
}

// overdue abandons the attempt if its handler has run for limit; otherwise
// it says how long to wait before looking again.
func (w *watch) overdue(now time.Time, limit time.Duration) (index int, wait time.Duration, abandon bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.inHandler {
		return 0, limit, false
	}
	if ran := now.Sub(w.started); ran < limit {
		return 0, limit - ran, false
	}
	w.abandoned = true
	return w.index, 0, true
}

type attemptResult struct {
	results []Result
	err     error
}

// supervised runs one attempt on a goroutine of its own and waits for it. A
// handler still running abandonGrace after its deadline ignores its
// context: the attempt is abandoned (see abandon) and the goroutine left to
// finish on its own, so that the worker goes on.
func (e *Engine) supervised(ctx context.Context, items []*Item, o *Options, p *plan) ([]Result, error) {
	w := &watch{}
	e.Vitals.active.Add(1)
	e.Vitals.moved()
	defer func() { e.Vitals.active.Add(-1); e.Vitals.moved() }()
	done := make(chan attemptResult, 1)
	go func() { // owned by the attempt; abandoned only with its handler
		res, err := e.attempt(ctx, items, o, p, w)
		done <- attemptResult{res, err}
	}()
	limit := e.cfg.HandlerTimeout + abandonGrace
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case r := <-done:
			return r.results, r.err
		case now := <-timer.C:
			index, wait, abandon := w.overdue(now, limit)
			if abandon {
				w.owner.gone.Store(true)
				e.keys.releaseAll(w.owner)
				return e.abandon(ctx, items, index, w.conn)
			}
			timer.Reset(max(wait, time.Millisecond))
		}
	}
}

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
	return nil, &excludeError{index: index, result: e.classify(items[index], &TimeoutError{Limit: e.cfg.HandlerTimeout, Abandoned: true})}
}
