package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox"
)

// A handler that reaches past the guard of its transaction — the raw
// connection (Conn) to COMMIT, or a savepoint of its own (Begin) — is what
// this file watches for and repairs.

// Conn returns the raw connection, which bypasses the guard: the runtime
// then checks, after the handler, that its transaction is still the one it
// began (a "COMMIT; BEGIN" sent here leaves a transaction open, another).
func (t *handlerTx) Conn() *pgx.Conn {
	if t.root != nil {
		return t.top().Conn()
	}
	if !t.raw {
		t.raw = true
		if t.xid == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			t.xid = transactionID(ctx, t.Tx, true)
		}
	}
	return t.Tx.Conn()
}

// Begin starts a pseudo nested transaction (a savepoint): the handler may
// commit or roll it back, but its statements pass the same guard.
func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	nested, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &nestedTx{&handlerTx{Tx: nested, b: t.b, root: t.top()}}, nil
}

// nestedTx is a handler's savepoint: its Commit and Rollback release or
// roll back the savepoint; everything else is guarded like the batch's
// transaction, whose state it shares.
type nestedTx struct{ *handlerTx }

func (n *nestedTx) Commit(ctx context.Context) error   { return n.handlerTx.Tx.Commit(ctx) }
func (n *nestedTx) Rollback(ctx context.Context) error { return n.handlerTx.Tx.Rollback(ctx) }

// Conn marks the batch's transaction as using the raw connection.
func (n *nestedTx) Conn() *pgx.Conn {
	n.top().Conn()
	return n.handlerTx.Tx.Conn()
}

// transactionID is the id of q's transaction, -1 for none or when it
// cannot be read. With assign, a transaction that has none yet is given
// one, so that the id stays the same for the rest of the transaction.
func transactionID(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, assign bool) int64 {
	sql := "SELECT txid_current_if_assigned()"
	if assign {
		sql = "SELECT txid_current()"
	}
	var xid *int64
	if err := q.QueryRow(ctx, sql).Scan(&xid); err != nil || xid == nil {
		return -1
	}
	return *xid
}

// replacedTx reports whether a handler that took the raw connection and
// left a transaction open left another one than the batch's ("COMMIT;
// BEGIN").
func (b *batch) replacedTx(ctx context.Context) bool {
	// Read even after a shutdown began: the answer decides whether the
	// batch's claims need repair.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.e.cfg.CommitTimeout)
	defer cancel()
	return transactionID(rctx, b.tx, false) != b.htx.xid
}

// repairEndedTx undoes what a handler that ended the batch transaction
// past the guard (a COMMIT through tx.Conn()) committed before its time: the
// inbox rows claimed for messages whose handler had not completed — and, if
// deferred writes were waiting (lost with the transaction), for those whose
// handler had. The rows are deleted on the same connection, now outside any
// transaction; the batch then runs again without the offending message.
// Writes the handlers made with tx.Exec before the early commit stay: a
// handler that ends the runtime's transaction is a bug, and this limits the
// damage to what it did itself.
func (b *batch) repairEndedTx(ctx context.Context) {
	lost := b.deferred != nil && b.deferred.Uses() > 0
	var ids []string
	for _, i := range b.runnable {
		if b.decisions[i].Decision == inbox.NewMessage && (!b.done[i] || lost) {
			ids = append(ids, b.items[i].ID)
		}
	}
	// Outside the batch transaction its lock_timeout is gone: the deadline
	// bounds a lock wait instead (pgx cancels the statement), which may
	// take all of it: not a wait readiness counts (see bounded).
	ctx, cancel := context.WithTimeout(ctx, b.plan.lockTimeout+b.e.cfg.CommitTimeout)
	defer cancel()
	conn := b.tx.Conn()
	if conn.PgConn().TxStatus() != 'I' {
		// The handler began a transaction of its own after its early
		// commit: what runs in it is not the batch's; drop it.
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
	if len(ids) == 0 {
		return
	}
	if _, err := b.e.inbox.RemoveClaims(ctx, conn, b.scope, ids); err != nil {
		b.e.cfg.Logger.Error("could not remove the inbox rows a handler committed early; those messages count as processed",
			"messages", len(ids), "error", err)
	}
}
