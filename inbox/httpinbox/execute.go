package httpinbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
)

// execute runs the handler in a transaction and answers. With a claim c, the
// transaction first re-locks c's record and ends by storing the response in
// it; without (a request with no key on an optional route) it is a plain
// transaction.
func (e *endpoint) execute(w http.ResponseWriter, r *http.Request, c *Claim) {
	m := e.m
	ctx := r.Context()
	if c != nil {
		ctx = context.WithValue(ctx, claimKey{}, c)
		r = r.WithContext(ctx)
	}
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		e.fail(w, c, fmt.Errorf("httpinbox: begin: %w", err))
		return
	}
	finished := false
	defer func() {
		// Reached unfinished only by a panic: roll back and leave the lease
		// to expire, as a crash would.
		if !finished {
			rollback(ctx, tx)
		}
	}()
	if c != nil && !e.relock(ctx, w, tx, c) {
		finished = true
		return
	}
	resp, herr := e.h(ctx, ownedTx{tx}, r)
	var rej *rejection
	switch {
	case errors.As(herr, &rej):
		finished = true
		rollback(ctx, tx)
		if c != nil {
			dctx, cancel := detached(ctx)
			_, err := m.pool.Exec(dctx, m.sql.delete, c.id[:], c.owner)
			cancel()
			if err != nil {
				m.log.Warn("httpinbox: could not delete a rejected request's key; it is retryable once its lease expires",
					"operation", c.operation, "key_id", c.id.Short(), "error", err)
			}
		}
		writeResponse(w, rej.resp.Status, rej.resp.Header, "", rej.resp.Body, false)
		return
	case herr != nil:
		finished = true
		rollback(ctx, tx)
		e.fail(w, c, fmt.Errorf("httpinbox: handler: %w", herr))
		return
	case resp.Status < 0 || resp.Status > 999 || (resp.Status > 0 && resp.Status < 100):
		finished = true
		rollback(ctx, tx)
		e.fail(w, c, fmt.Errorf("httpinbox: handler returned status %d", resp.Status))
		return
	case resp.Status >= 500 && !resp.unknown:
		finished = true
		rollback(ctx, tx)
		e.release(c)
		writeResponse(w, resp.Status, resp.Header, resp.ResourceID, resp.Body, false)
		return
	}
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	if c != nil {
		if err := e.complete(ctx, tx, c, resp); err != nil {
			finished = true
			rollback(ctx, tx)
			e.fail(w, c, err)
			return
		}
	}
	finished = true
	dctx, cancel := detached(ctx)
	err = tx.Commit(dctx)
	cancel()
	if err != nil {
		e.resolveCommit(w, c, err)
		return
	}
	// Committed: from here on a crash loses only this answer; the retry
	// receives the stored one.
	if c != nil && resp.unknown {
		m.metrics.unknown.Add(ctx, 1, m.metrics.opt(c.operation))
		m.log.Warn("httpinbox: handler reported an unknown outcome; the key will not run again",
			"operation", c.operation, "key_id", c.id.Short())
	}
	writeResponse(w, resp.Status, resp.Header, resp.ResourceID, resp.Body, false)
}

// relock locks c's record again in tx, the handler's transaction; false
// means it answered already (and rolled tx back): the lease expired and
// another request took the key over, or the database failed.
func (e *endpoint) relock(ctx context.Context, w http.ResponseWriter, tx pgx.Tx, c *Claim) bool {
	m := e.m
	var mine bool
	err := tx.QueryRow(ctx, m.sql.relock, c.id[:], c.owner).Scan(&mine)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		rollback(ctx, tx)
		m.metrics.inProgress.Add(ctx, 1, m.metrics.opt(c.operation))
		writeProblem(w, http.StatusConflict, CodeInProgress,
			"a request with this Idempotency-Key is in progress", retryAfter(m.cfg.RetryAfter))
		return false
	case err != nil:
		rollback(ctx, tx)
		e.fail(w, c, fmt.Errorf("httpinbox: lock key %s: %w", c.id.Short(), err))
		return false
	}
	return true
}

// complete stores resp in c's record, in the handler's transaction.
func (e *endpoint) complete(ctx context.Context, tx pgx.Tx, c *Claim, resp Response) error {
	m := e.m
	st := e.store(resp)
	state := KeyCompleted
	switch {
	case resp.unknown:
		state = KeyUnknown
	case resp.Status >= 400:
		state = KeyFailedReplayable
	}
	var body []byte
	if !st.bodyOmitted {
		body = st.body
	}
	tag, err := tx.Exec(ctx, m.sql.complete, c.id[:], c.owner, state, st.status, st.header, body, st.bodyOmitted, st.resourceID)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("record not locked by this request")
	}
	if err != nil {
		return fmt.Errorf("httpinbox: store response for key %s: %w", c.id.Short(), err)
	}
	return nil
}

// store returns the part of resp that the record keeps.
func (e *endpoint) store(resp Response) stored {
	st := stored{status: resp.Status, header: http.Header{}, body: resp.Body, resourceID: resp.ResourceID}
	for k, vs := range resp.Header {
		if e.m.stored[http.CanonicalHeaderKey(k)] {
			st.header[http.CanonicalHeaderKey(k)] = vs
		}
	}
	st.bodyOmitted = e.route.OmitBody || len(resp.Body) > e.m.cfg.MaxStoredBodyBytes
	return st
}

// resolveCommit answers after a failed COMMIT, which may or may not have
// committed. Releasing the lease is the proof: it waits for the row lock of
// the transaction and matches only if the record is still started by this
// request, i.e. the transaction did not commit. If the record is no longer
// started, the stored response is sent; if nothing can be read, the outcome
// is unknown to this request, and a retry with the key resolves it.
func (e *endpoint) resolveCommit(w http.ResponseWriter, c *Claim, commitErr error) {
	m := e.m
	if c == nil {
		m.log.Error("httpinbox: commit failed; outcome unknown", "operation", e.route.Operation, "error", commitErr)
		writeProblem(w, http.StatusInternalServerError, CodeOutcomeUnknown, "the outcome of the request is unknown", 0)
		return
	}
	ctx, cancel := detached(context.Background())
	defer cancel()
	tag, err := m.pool.Exec(ctx, m.sql.release, c.id[:], c.owner)
	if err == nil && tag.RowsAffected() == 1 {
		m.log.Warn("httpinbox: commit failed; key released", "operation", c.operation, "key_id", c.id.Short(), "error", commitErr)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "the request failed; retry with the same key", 0)
		return
	}
	if err == nil {
		var rec record
		var found bool
		rec, found, err = m.read(ctx, c.id)
		if err == nil && found && rec.state != KeyStarted {
			writeResponse(w, rec.status, rec.header, rec.resourceID, rec.body, false)
			return
		}
	}
	m.metrics.unknown.Add(ctx, 1, m.metrics.opt(c.operation))
	m.log.Error("httpinbox: commit failed and its outcome cannot be read; a retry with the key resolves it",
		"operation", c.operation, "key_id", c.id.Short(), "error", commitErr, "resolve_error", err)
	writeProblem(w, http.StatusInternalServerError, CodeOutcomeUnknown,
		"the outcome of the request is unknown; retry with the same key", 0)
}

// fail answers 500 after the transaction rolled back and releases the key.
func (e *endpoint) fail(w http.ResponseWriter, c *Claim, err error) {
	attrs := []any{"operation", e.route.Operation, "error", err}
	if c != nil {
		attrs = append(attrs, "key_id", c.id.Short())
	}
	e.m.log.Error("httpinbox: request failed; key released", attrs...)
	e.release(c)
	writeProblem(w, http.StatusInternalServerError, CodeInternal, "the request failed; retry with the same key", 0)
}

// release ends c's lease so that the next request with the key runs.
func (e *endpoint) release(c *Claim) {
	if c == nil {
		return
	}
	ctx, cancel := detached(context.Background())
	defer cancel()
	if _, err := e.m.pool.Exec(ctx, e.m.sql.release, c.id[:], c.owner); err != nil {
		e.m.log.Warn("httpinbox: could not release a key; it runs again once its lease expires",
			"operation", c.operation, "key_id", c.id.Short(), "error", err)
	}
}

// ErrTxOwned is returned when a handler tries to commit or roll back the
// middleware's transaction: the record must commit with the business write,
// after the handler returned.
var ErrTxOwned = errors.New("httpinbox: the transaction belongs to the middleware; return from the handler instead")

// ownedTx is the transaction as a handler sees it: everything but Commit and
// Rollback. Savepoints (tx.Begin) work as usual.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }

// detached returns a context that outlives the request's cancellation, for
// the work that must finish after the client left.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), detachedTimeout)
}

// rollback ends tx on a detached context.
func rollback(ctx context.Context, tx pgx.Tx) {
	dctx, cancel := detached(ctx)
	defer cancel()
	_ = tx.Rollback(dctx) // a failed rollback closes the connection, which rolls back too
}
