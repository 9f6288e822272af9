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

// enter notes that handler index starts now and returns when it started.
func (w *watch) enter(index int) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inHandler, w.index, w.started = true, index, time.Now()
	return w.started
}

// leave reports whether the handler that just returned ran out of time,
// and whether the attempt is still the goroutine's to finish. After leave
// the supervisor no longer ends the handlers' context.
func (w *watch) leave() (expired, ours bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inHandler = false
	return w.expired, !w.abandoned
}

// release reports whether the connection is still the attempt's to release.
func (w *watch) release() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.abandoned
}

// overdue ends the running handler's context once it has run for timeout,
// and abandons the attempt once it has run for timeout+grace; otherwise it
// says how long to wait before looking again.
func (w *watch) overdue(now time.Time, timeout, grace time.Duration) (index int, wait time.Duration, abandon bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.inHandler {
		return 0, timeout, false
	}
	ran := now.Sub(w.started)
	if ran < timeout {
		return 0, timeout - ran, false
	}
	if !w.expired && w.expire != nil {
		w.expired = true
		w.expire(errHandlerDeadline)
	}
	if ran < timeout+grace {
		return 0, timeout + grace - ran, false
	}
	w.abandoned = true
	return w.index, 0, true
}

// handlerContext is a handler's context: the attempt's handler context,
// which the supervisor ends with errHandlerDeadline, and the handler's own
// deadline. The handler sees its deadline, and a timeout as
// context.DeadlineExceeded, as with context.WithTimeout; contexts it makes
// with context.WithCancel, WithTimeout or WithDeadline end with
// context.Canceled (and the cause errHandlerDeadline), since they hang off
// the attempt's one cancellable context.
type handlerContext struct {
	context.Context
	deadline time.Time
}

func (c *handlerContext) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

func (c *handlerContext) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errHandlerDeadline {
		return context.DeadlineExceeded
	}
	return err
}

type attemptResult struct {
	results []Result
	err     error
}

// supervised runs one attempt on a goroutine of its own and waits for it.
// It ends the context of a handler that runs past HandlerTimeout; a
// handler still running abandonGrace after that ignores its
// context: the attempt is abandoned (see abandon) and the goroutine left to
// finish on its own, so that the worker goes on.
func (e *Engine) supervised(ctx context.Context, items []*Item, o *Options, p *plan) (_ []Result, err error) {
	w := &watch{}
	defer w.finish()
	e.Vitals.started()
	defer func() { e.Vitals.ended(err) }()
	done := make(chan attemptResult, 1)
	go func() { // owned by the attempt; abandoned only with its handler
		res, err := e.attempt(ctx, items, o, p, w)
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
