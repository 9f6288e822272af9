package consumer

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Defer runs a statement whose result the handler does not need — an
// increment, an upsert, an insert — as part of the batch: all the batch's
// deferred statements are sent together, in the order they were deferred, in
// one round trip just before the batch commits. A handler that only writes
// saves its round trip per message this way.
//
// Deferred statements run after every handler of the batch has returned, so
// defer only writes that no later handler of the same batch reads back
// (commutative increments and version-guarded upserts are the typical case).
// If one of them fails, the runtime runs the batch again with a savepoint per
// message, where Defer executes at once and returns the error to the handler
// that caused it. Outside a batch without savepoints (or outside the runtime)
// Defer is tx.Exec.
func Defer(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	if d := idem.DeferredFrom(ctx); d != nil {
		q := d.Use(deferKey{}, func() idem.Flusher { return &deferredExecs{} }).(*deferredExecs)
		q.add(sql, args)
		return nil
	}
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

type deferKey struct{}

// deferredExecs is the batch's queue of deferred statements.
type deferredExecs struct {
	mu    sync.Mutex
	batch pgx.Batch
}

func (d *deferredExecs) add(sql string, args []any) {
	d.mu.Lock()
	d.batch.Queue(sql, args...)
	d.mu.Unlock()
}

// Flush sends the queued statements in one round trip.
func (d *deferredExecs) Flush(ctx context.Context, tx pgx.Tx) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.batch.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, &d.batch).Close(); err != nil {
		return fmt.Errorf("consumer: %d deferred statements: %w", d.batch.Len(), err)
	}
	return nil
}
