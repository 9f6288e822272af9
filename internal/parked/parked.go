// Package parked owns idem's projection_parked table: the events a
// projection Guard keeps aside until the versions before them are applied
// (package projection), which a rebuild swaps in or deletes with its shadow
// tables (package replay). Every statement on the table is here.
package parked

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// Table is the projection_parked table of one set of idem tables.
type Table struct {
	insert, take, remove, rename string
}

// New returns the projection_parked table of t.
func New(t idem.Tables) Table {
	name := t.Table("projection_parked")
	return Table{
		insert: `INSERT INTO ` + name + ` (projection, entity, entity_key, version, event) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`,
		// The parked events of the entity up to the version asked for:
		// those below it are stale and go; the one at it, if parked, is
		// returned.
		take: `DELETE FROM ` + name + ` WHERE projection = $1 AND entity = $2 AND entity_key = $3 AND version <= $4
RETURNING version, event`,
		remove: `DELETE FROM ` + name + ` WHERE projection = $1`,
		rename: `UPDATE ` + name + ` SET projection = $1 WHERE projection = $2`,
	}
}

// Park keeps event aside as version of the entity's key, for projection.
// An event parked already stays as it was.
func (t Table) Park(ctx context.Context, tx pgx.Tx, projection, entity, key string, version int64, event []byte) error {
	if _, err := tx.Exec(ctx, t.insert, projection, entity, key, version, event); err != nil {
		return fmt.Errorf("parked: insert: %w", err)
	}
	return nil
}

// Take deletes the entity's events parked for projection up to version and
// returns the one at version, or nil when it was not parked.
func (t Table) Take(ctx context.Context, tx pgx.Tx, projection, entity, key string, version int64) ([]byte, error) {
	rows, err := tx.Query(ctx, t.take, projection, entity, key, version)
	if err != nil {
		return nil, fmt.Errorf("parked: take: %w", err)
	}
	defer rows.Close()
	var event []byte
	for rows.Next() {
		var v int64
		var b []byte
		if err := rows.Scan(&v, &b); err != nil {
			return nil, fmt.Errorf("parked: take: %w", err)
		}
		if v == version {
			event = b
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("parked: take: %w", err)
	}
	return event, nil
}

// Replace makes the events parked for projection from those of projection
// to, dropping to's own: a rebuild's shadow projection swapped in.
func (t Table) Replace(ctx context.Context, tx pgx.Tx, from, to string) error {
	b := &pgx.Batch{}
	b.Queue(t.remove, to)
	b.Queue(t.rename, to, from)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("parked: replace %s with %s: %w", to, from, err)
	}
	return nil
}

// Delete deletes the events parked for projection.
func (t Table) Delete(ctx context.Context, tx pgx.Tx, projection string) error {
	if _, err := tx.Exec(ctx, t.remove, projection); err != nil {
		return fmt.Errorf("parked: delete %s: %w", projection, err)
	}
	return nil
}
