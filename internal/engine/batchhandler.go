package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// runTogether runs the batch handler over the items it takes at once. If
// it fails, the batch runs again item by item, a savepoint each, so that
// each failure is attributed to its item.
func (b *batch) runTogether(ctx context.Context, together []int) error {
	its := make([]*Item, len(together))
	for k, i := range together {
		its[k] = b.items[i]
	}
	herr, err := b.call(ctx, -1, func(hctx context.Context) error { return b.e.handleBatch(hctx, b.htx, its) })
	var ex *excludeError
	switch {
	case errors.As(err, &ex):
		if b.ended {
			b.repairEndedTx(ctx) // nothing of the batch handler can be trusted
		}
		return errNeedSavepoints // message by message, to find the culprit
	case err != nil:
		return err
	case herr == nil:
		for _, i := range together {
			b.results[i].Outcome = idem.Processed
		}
		return nil
	case isContention(herr):
		return &batchError{err: fmt.Errorf("batch handler: %w", herr), contention: true}
	default:
		return errNeedSavepoints
	}
}

// handleBatch runs the batch handler on its items' messages and turns a
// panic into an *idem.PanicError, logged with its stack.
func (e *Engine) handleBatch(ctx context.Context, tx pgx.Tx, its []*Item) (err error) {
	msgs := make([]*idem.Message, len(its))
	for i, it := range its {
		msgs[i] = it.Message
	}
	defer e.recoverPanic(&err, "batch handler panicked", "")
	return e.cfg.BatchHandler(ctx, tx, msgs)
}
