package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrHeld is returned (wrapped) by DeleteScope for a scope under a Hold.
var ErrHeld = errors.New("inbox: the scope is held")

const (
	holdSQL    = `INSERT INTO %[3]s (consumer, reason) VALUES ($1, $2) ON CONFLICT (consumer) DO UPDATE SET reason = EXCLUDED.reason`
	releaseSQL = `DELETE FROM %[3]s WHERE consumer = $1`
	heldSQL    = `SELECT EXISTS (SELECT 1 FROM %[3]s WHERE consumer = $1)`
)

// Hold keeps retention away from consumer's rows until Release: Cleanup
// (and so `idem cleanup`, `idem inbox cleanup` and retention.Run) never
// deletes a row of a held scope, however old. An online rebuild holds its
// private scope from the transaction that registers the run until the one
// that swaps it in or abandons it, so that a rebuild interrupted for days
// resumes with every message it applied still known. reason is shown to
// operators. Holding a held scope again replaces its reason.
func (ib *Inbox) Hold(ctx context.Context, tx pgx.Tx, consumer, reason string) error {
	if err := ib.validateKey(0, consumer, "-"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, ib.sql.hold, consumer, reason); err != nil {
		return fmt.Errorf("inbox: hold %q: %w", consumer, err)
	}
	return nil
}

// Release ends the Hold on consumer's rows in tx; releasing a scope that is
// not held does nothing.
func (ib *Inbox) Release(ctx context.Context, tx pgx.Tx, consumer string) error {
	if _, err := tx.Exec(ctx, ib.sql.release, consumer); err != nil {
		return fmt.Errorf("inbox: release %q: %w", consumer, err)
	}
	return nil
}

// Held reports whether consumer's rows are under a Hold.
func (ib *Inbox) Held(ctx context.Context, q Querier, consumer string) (bool, error) {
	var held bool
	if err := q.QueryRow(ctx, ib.sql.held, consumer).Scan(&held); err != nil {
		return false, fmt.Errorf("inbox: is %q held: %w", consumer, err)
	}
	return held, nil
}
