package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTransactionControl is returned to a handler that tries to end or
// restructure the batch transaction, which belongs to the runtime: its
// Commit and Rollback methods, and statements such as COMMIT, ROLLBACK,
// BEGIN, SAVEPOINT or PREPARE TRANSACTION sent through Exec, Query,
// QueryRow, SendBatch or Prepare. Nothing is sent; the message is
// dead-lettered with reason handler_ended_transaction.
var ErrTransactionControl = errors.New("the runtime owns the batch transaction: a handler must not commit, roll back or use savepoints; return an error instead")

// handlerTx is the transaction handlers get. It refuses transaction control
// and remembers that the handler tried, so that the runtime fails the
// message even when the handler swallows the error. It also names the rows
// the handler writes (see writeKeys) and postpones a message whose first
// write names a row another batch in flight wrote.
type handlerTx struct {
	pgx.Tx
	violated atomic.Bool

	b        *batch // whose keys the handler's writes are
	postpone bool   // the current message may be postponed
	wrote    bool   // the current message has written
	// postponed reports that the current message was postponed: every
	// statement it sent after that was refused, so nothing of it was written.
	postponed bool
	// deferredAt is the batch's deferred-write count when the message
	// began: a message that deferred a write has written.
	deferredAt int
	// contention is the last lock conflict one of the message's statements
	// met, however the handler wraps it; foreign reports that it was on a
	// row no other batch of this process wrote: another process holds it.
	contention error
	foreign    bool
	owned      bool // the last write statement's row is this batch's alone
	// raw reports that the current message's handler took the raw
	// connection (Conn), which bypasses the guard. xid is the batch
	// transaction's id, read the first time one of its handlers took it:
	// one round trip per batch, and one after each such handler to compare.
	raw bool
	xid int64
	// root is the batch's own transaction when this one is a handler's
	// savepoint (Begin); nil for the root itself.
	root *handlerTx
}

// top is the batch's own transaction, whose state the guard keeps.
func (t *handlerTx) top() *handlerTx {
	if t.root != nil {
		return t.root
	}
	return t
}

// errPostponed is what a postponed message's statements return.
var errPostponed = errors.New("engine: another batch in flight writes this row; the message runs in a later batch")

// next readies the transaction for the next message's handler.
func (t *handlerTx) next(postpone bool) {
	t.postpone, t.wrote, t.postponed, t.contention, t.raw = postpone, false, false, nil, false
	t.foreign, t.owned = false, false
	if t.b != nil && t.b.deferred != nil {
		t.deferredAt = t.b.deferred.Uses()
	}
}

// deferredSince reports whether the current message deferred a write.
func (t *handlerTx) deferredSince() bool {
	return t.b != nil && t.b.deferred != nil && t.b.deferred.Uses() != t.deferredAt
}

// note remembers a lock conflict among a statement's errors.
func (t *handlerTx) note(err error) error {
	if err != nil && isContention(err) {
		top := t.top()
		top.contention, top.foreign = err, top.owned
	}
	return err
}

// admit lets a statement through, or postpones the message: a write whose
// row another batch in flight wrote, before the message wrote anything.
func (t *handlerTx) admit(sql string, args []any) error {
	t = t.top()
	if t.postponed {
		return errPostponed
	}
	if t.b == nil || !isWrite(sql) {
		return nil
	}
	key := rowKey(sql, args)
	mayPostpone := t.postpone && !t.wrote && !t.deferredSince()
	t.owned = t.b.e.keys.take(t.b, key, !mayPostpone)
	if !t.owned && mayPostpone {
		t.postponed = true
		return errPostponed
	}
	t.b.keys = append(t.b.keys, key)
	t.wrote = true
	return nil
}

func (t *handlerTx) refuse(what string) error {
	t.top().violated.Store(true)
	return fmt.Errorf("%w (%s)", ErrTransactionControl, what)
}

func (t *handlerTx) check(sql string) error {
	if word, ok := transactionControl(sql); ok {
		return t.refuse(word)
	}
	return nil
}

func (t *handlerTx) Commit(context.Context) error   { return t.refuse("Commit") }
func (t *handlerTx) Rollback(context.Context) error { return t.refuse("Rollback") }

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := t.admit(sql, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.Tx.Exec(ctx, sql, args...)
	return tag, t.note(err)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	if err := t.admit(sql, args); err != nil {
		return nil, err
	}
	rows, err := t.Tx.Query(ctx, sql, args...)
	return rows, t.note(err)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.check(sql); err != nil {
		return errRow{err}
	}
	if err := t.admit(sql, args); err != nil {
		return errRow{err}
	}
	return noteRow{t.Tx.QueryRow(ctx, sql, args...), t}
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := t.check(q.SQL); err != nil {
			return errBatch{err}
		}
		if err := t.admit(q.SQL, q.Arguments); err != nil {
			return errBatch{err}
		}
	}

	return t.Tx.SendBatch(ctx, b)
}

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.check(sql); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// noteRow remembers a lock conflict met by a QueryRow.
type noteRow struct {
	pgx.Row
	t *handlerTx
}

func (r noteRow) Scan(dest ...any) error { return r.t.note(r.Row.Scan(dest...)) }

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

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// controlWords start statements that end or restructure a transaction.
var controlWords = map[string]bool{
	"BEGIN": true, "START": true, "COMMIT": true, "END": true, "ROLLBACK": true,
	"ABORT": true, "SAVEPOINT": true, "RELEASE": true,
}

// transactionControl reports whether any statement in sql is transaction
// control, and its first word. It skips comments, string literals, quoted
// identifiers and dollar-quoted bodies, so that `DO $$ BEGIN … END $$` and
// `SELECT 'commit'` pass.
func transactionControl(sql string) (string, bool) {
	start := true // at the start of a statement
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == ';':
			start = true
			i++
		case start && isLetter(c):
			j := i
			for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_') {
				j++
			}
			word := strings.ToUpper(sql[i:j])
			if controlWords[word] || word == "PREPARE" && nextWord(sql, j) == "TRANSACTION" {
				return word, true
			}
			start = false
			i = j
		default:
			start = false
			i = skipToken(sql, i)
		}
	}
	return "", false
}

// skipToken skips the literal, identifier or character at i.
func skipToken(sql string, i int) int {
	switch c := sql[i]; {
	case c == '\'':
		escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e')
		return skipQuoted(sql, i, '\'', escapes)
	case c == '"':
		return skipQuoted(sql, i, '"', false)
	case c == '$':
		if tag, ok := dollarTag(sql, i); ok {
			if end := strings.Index(sql[i+len(tag):], tag); end >= 0 {
				return i + len(tag) + end + len(tag)
			}
			return len(sql)
		}
	case isLetter(c) || c == '_':
		j := i
		for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_' || sql[j] >= '0' && sql[j] <= '9' || sql[j] == '$') {
			j++
		}
		return j
	}
	return i + 1
}

// skipQuoted skips a quoted literal or identifier starting at i; a doubled
// quote is an escaped one, and so is a backslash-escaped one in E'…'.
func skipQuoted(sql string, i int, q byte, backslash bool) int {
	for j := i + 1; j < len(sql); j++ {
		switch {
		case backslash && sql[j] == '\\':
			j++
		case sql[j] == q && j+1 < len(sql) && sql[j+1] == q:
			j++
		case sql[j] == q:
			return j + 1
		}
	}
	return len(sql)
}

// skipBlockComment skips a (nestable) /* … */ comment starting at i.
func skipBlockComment(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case strings.HasPrefix(sql[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(sql[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

// dollarTag returns the $tag$ opening a dollar-quoted string at i.
func dollarTag(sql string, i int) (string, bool) {
	j := i + 1
	if j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
		return "", false // a parameter: $1
	}
	for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_' || sql[j] >= '0' && sql[j] <= '9') {
		j++
	}
	if j < len(sql) && sql[j] == '$' {
		return sql[i : j+1], true
	}
	return "", false
}

func nextWord(sql string, i int) string {
	for i < len(sql) && (sql[i] == ' ' || sql[i] == '\t' || sql[i] == '\n' || sql[i] == '\r') {
		i++
	}
	j := i
	for j < len(sql) && isLetter(sql[j]) {
		j++
	}
	return strings.ToUpper(sql[i:j])
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 }
