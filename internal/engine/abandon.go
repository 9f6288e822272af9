package engine

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

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
