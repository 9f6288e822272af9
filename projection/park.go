package projection

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// parkEvent keeps ev aside until the versions before it are applied.
func (g *Guard[E]) parkEvent(ctx context.Context, tx pgx.Tx, key string, version int64, ev E) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("projection %s: park %s %q version %d: encode: %w", g.p.name, g.cfg.Table, key, version, err)
	}
	if err := g.park.Park(ctx, tx, g.p.scope(ctx), g.cfg.Table, key, version, body); err != nil {
		return fmt.Errorf("projection %s: park %s %q version %d: %w", g.p.name, g.cfg.Table, key, version, err)
	}
	return nil
}

// unpark applies the parked events of the entity that follow version, one
// after the other, as long as the next version is parked.
func (g *Guard[E]) unpark(ctx context.Context, tx pgx.Tx, key string, version int64) error {
	scope := g.p.scope(ctx)
	for {
		next, found, err := g.take(ctx, tx, scope, key, version)
		if err != nil || !found {
			return err
		}
		if err := g.cfg.Apply(ctx, tx, next); err != nil {
			return err
		}
		g.p.m.count(ctx, g.p.name, countUnparked)
		version++
	}
}

// take removes the entity's parked events up to version+1 and returns the
// one at version+1, if it was parked.
func (g *Guard[E]) take(ctx context.Context, tx pgx.Tx, scope, key string, version int64) (E, bool, error) {
	var next E
	body, err := g.park.Take(ctx, tx, scope, g.cfg.Table, key, version+1)
	if err != nil {
		return next, false, fmt.Errorf("projection %s: unpark %s %q: %w", g.p.name, g.cfg.Table, key, err)
	}
	if body == nil {
		return next, false, nil
	}
	if err := json.Unmarshal(body, &next); err != nil {
		return next, false, fmt.Errorf("projection %s: unpark %s %q version %d: decode: %w", g.p.name, g.cfg.Table, key, version+1, err)
	}
	return next, true, nil
}
