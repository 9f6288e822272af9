package ledger

import (
	"context"
	"fmt"
	"time"
)

// The ledger's horizon. Retention deletes a settled effect's row and, in
// the same statement, leaves a tombstone (DeleteSettled): the effect id, its
// idempotency key, how and when it settled, and when its row went. An
// effect recorded again under a tombstoned id is written as suppressed, so
// nothing retention forgot is ever sent twice.

// tombstoneNote is the last_error of an effect suppressed because of the
// tombstone t.
const tombstoneNote = `'settled before as ' || t.status || ' at ' ||
	to_char(t.settled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') ||
	'; retention removed it at ' || to_char(t.deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') ||
	'; recorded again: suppressed, never sent'`

// guardSQL suppresses the pending effect $1 when it has a tombstone. It is
// for one case: retention deleted the row under the id and committed its
// tombstone while the insert ran, after the insert's snapshot was taken, so
// that the insert saw the row but not the tombstone, and inserted once the
// row was gone. Its own snapshot, taken after the insert, sees the
// tombstone. Record sends it in a second round trip when the insert's
// snapshot held a row it did not conflict with (that is the only sign); a
// deferred flush sends it with the notification, in the round trip it
// takes anyway, for every effect it inserted as pending. Without a
// tombstone it is one probe of the tombstones' primary key (the ledger is
// not read).
const guardSQL = `UPDATE {ledger} SET status = 'suppressed',
	last_error = (SELECT ` + tombstoneNote + ` FROM {tombstones} AS t WHERE t.effect_id = $1)
WHERE effect_id = $1 AND status = 'pending'
	AND EXISTS (SELECT 1 FROM {tombstones} AS t WHERE t.effect_id = $1)
RETURNING {columns}`

// guardManySQL is guardSQL for the effects $1 a deferred flush inserted as
// pending.
const guardManySQL = `UPDATE {ledger} AS l SET status = 'suppressed', last_error = ` + tombstoneNote + `
FROM {tombstones} AS t
WHERE t.effect_id = ANY($1::text[]) AND l.effect_id = t.effect_id AND l.status = 'pending'
RETURNING l.effect_type`

const tombstoneSQL = `SELECT effect_id, idempotency_key, status, settled_at, deleted_at
FROM {tombstones} WHERE effect_id = $1`

// Tombstone is what the ledger keeps of a settled effect after retention
// removed its row.
type Tombstone struct {
	// ID is the effect id.
	ID string
	// IdempotencyKey is the key every attempt of the effect was sent with.
	IdempotencyKey string
	// Status is how the effect settled: StatusSucceeded,
	// StatusFailedTerminal (as an operator resolved it) or
	// StatusSuppressed.
	Status Status
	// SettledAt is when it settled (when it was recorded, for a suppressed
	// effect).
	SettledAt time.Time
	// DeletedAt is when retention removed its row, or last removed a
	// suppressed row recorded again under its id.
	DeletedAt time.Time
}

// Tombstone returns what the ledger keeps of the effect with id id after
// retention removed it, or an error matching ErrNotFound when it has no
// tombstone (it is still in the ledger, see Get, was never recorded, or
// its tombstone was deleted too).
func (l *Ledger) Tombstone(ctx context.Context, id string) (Tombstone, error) {
	if err := l.needPool(); err != nil {
		return Tombstone{}, err
	}
	var (
		t      Tombstone
		status string
	)
	err := l.pool.QueryRow(ctx, l.sql.tombstone, id).Scan(&t.ID, &t.IdempotencyKey, &status, &t.SettledAt, &t.DeletedAt)
	if err != nil {
		return Tombstone{}, fmt.Errorf("ledger: tombstone %s: %w", id, notFound(id, err))
	}
	t.Status = Status(status)
	return t, nil
}
