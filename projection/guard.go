package projection

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/parked"
)

// GapPolicy says what a Guard does with an event whose version skips
// versions the projection has not applied (version 3 while the row is at 1).
type GapPolicy uint8

const (
	// GapApply applies the event: the row shows the newest state known, and
	// the skipped versions are stale when they arrive. The final row does
	// not depend on the order of arrival. The default.
	GapApply GapPolicy = iota
	// GapPark keeps the event aside (in idem's projection_parked table,
	// written in the handler's transaction) until the versions before it
	// are applied; then it is applied, in the same transaction as the event
	// that filled the gap. The row never skips a version.
	GapPark
	// GapFail fails the message with an error wrapping ErrGap: the consumer
	// retries it (a queue redelivers it later, a stream retries it in place)
	// and dead-letters it after its MaxAttempts.
	GapFail
)

// String returns "apply", "park" or "fail".
func (g GapPolicy) String() string {
	switch g {
	case GapApply:
		return "apply"
	case GapPark:
		return "park"
	case GapFail:
		return "fail"
	default:
		return fmt.Sprintf("GapPolicy(%d)", uint8(g))
	}
}

// Decision is what a Guard did with an event.
type Decision uint8

const (
	// Applied: the event was newer and Apply ran (in forensic mode: would
	// run).
	Applied Decision = iota + 1
	// Stale: the projection already holds this version or a newer one; the
	// event is a no-op.
	Stale
	// Parked: the event came after a gap and waits for the versions before
	// it (GapPark).
	Parked
)

// String returns "applied", "stale" or "parked".
func (d Decision) String() string {
	switch d {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	case Parked:
		return "parked"
	default:
		return fmt.Sprintf("Decision(%d)", uint8(d))
	}
}

// ErrGap is wrapped by the error of a Guard with GapFail for an event after
// a gap.
var ErrGap = errors.New("projection: version gap")

// GuardConfig configures NewGuard. Every field is required unless its
// comment gives a default.
type GuardConfig[E any] struct {
	// Apply writes ev into the projection, in the handler's transaction,
	// including ev's version into VersionColumn. It runs only for an event
	// the guard applies, and never in forensic mode.
	Apply func(ctx context.Context, tx pgx.Tx, ev E) error
	// First is the version of an entity's first event: an event of an
	// entity the table has no row for is in order at First, after a gap
	// above it. Default: 1.
	First int64
	// Gaps is the gap policy. Default: GapApply.
	Gaps GapPolicy
	// Key returns the entity an event belongs to: the value of KeyColumn.
	Key func(ev E) string
	// KeyColumn is the column of Table that identifies the entity.
	KeyColumn string
	// Projection declares Table.
	Projection *Projection
	// Table is the declared table whose rows carry the version, one row per
	// entity.
	Table string
	// Tables says where idem's tables are: parked events go to its
	// projection_parked table. Use the consumer's Config.Tables (a rebuild
	// moves a projection's parked events there). Default: idem's defaults.
	Tables idem.Tables
	// Version returns an event's version.
	Version func(ev E) int64
	// VersionColumn is the column of Table holding the version applied last.
	VersionColumn string
}

// Guard applies events to a projection newest-wins: an event newer than
// the entity's row is applied, a stale one is a no-op, and one after a gap
// follows the gap policy. Every decision is counted in the metric
// idem.projection.events. It is safe for concurrent use.
type Guard[E any] struct {
	cfg          GuardConfig[E]
	p            *Projection
	live, shadow guardSQL
	park         parked.Table
}

// guardSQL are the statements reading an entity's version in one table.
type guardSQL struct {
	lock, read string // with and without FOR UPDATE
}

// NewGuard returns the guard cfg describes.
func NewGuard[E any](cfg GuardConfig[E]) (*Guard[E], error) {
	if cfg.First == 0 {
		cfg.First = 1
	}
	switch {
	case cfg.Projection == nil:
		return nil, fmt.Errorf("%w: GuardConfig.Projection is required", ErrConfig)
	case cfg.Projection.live[cfg.Table] == "":
		return nil, fmt.Errorf("%w: projection %q does not declare table %q", ErrConfig, cfg.Projection.name, cfg.Table)
	case cfg.Apply == nil || cfg.Key == nil || cfg.Version == nil:
		return nil, fmt.Errorf("%w: GuardConfig needs Apply, Key and Version", ErrConfig)
	case cfg.KeyColumn == "" || cfg.VersionColumn == "":
		return nil, fmt.Errorf("%w: GuardConfig needs KeyColumn and VersionColumn", ErrConfig)
	case cfg.Gaps > GapFail:
		return nil, fmt.Errorf("%w: unknown gap policy %d", ErrConfig, cfg.Gaps)
	}
	if err := cfg.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	p := cfg.Projection
	key, version := pgx.Identifier{cfg.KeyColumn}.Sanitize(), pgx.Identifier{cfg.VersionColumn}.Sanitize()
	sel := func(table string) guardSQL {
		read := `SELECT ` + version + ` FROM ` + table + ` WHERE ` + key + ` = $1`
		return guardSQL{lock: read + ` FOR UPDATE`, read: read}
	}
	return &Guard[E]{cfg: cfg, p: p, live: sel(p.live[cfg.Table]), shadow: sel(p.shadow[cfg.Table]),
		park: parked.New(cfg.Tables)}, nil
}

// verdict is the guard's reading of an event against the row.
type verdict uint8

const (
	inOrder verdict = iota + 1
	stale
	gap
)

// judge compares an event's version with the row's (exists false: no row;
// the entity is at first-1).
func judge(version, current int64, exists bool, first int64) verdict {
	if !exists {
		current = first - 1
	}
	switch {
	case version <= current:
		return stale
	case version == current+1:
		return inOrder
	default:
		return gap
	}
}

// Handle applies ev if it is newer than its entity's row, following the
// gap policy, and returns what it did. Call it from the consumer's handler
// with the handler's transaction. The entity's row is locked (SELECT … FOR
// UPDATE) until the transaction ends, so concurrent events of one entity
// apply one after the other.
//
// In forensic mode (idem.ModeFrom(ctx) == idem.Forensic) it writes nothing:
// it reads the row and returns what it would do.
func (g *Guard[E]) Handle(ctx context.Context, tx pgx.Tx, ev E) (Decision, error) {
	key, version := g.cfg.Key(ev), g.cfg.Version(ev)
	forensic := idem.ModeFrom(ctx) == idem.Forensic
	current, exists, err := g.current(ctx, tx, key, forensic)
	if err != nil {
		return 0, err
	}
	v := judge(version, current, exists, g.cfg.First)
	switch {
	case v == stale:
		g.p.m.count(ctx, g.p.name, countStale)
		return Stale, nil
	case v == gap && g.cfg.Gaps == GapFail:
		g.p.m.count(ctx, g.p.name, countGapFailed)
		if !exists {
			current = g.cfg.First - 1
		}
		return 0, fmt.Errorf("%w: projection %s, %s %q: event version %d, row at version %d",
			ErrGap, g.p.name, g.cfg.Table, key, version, current)
	case v == gap && g.cfg.Gaps == GapPark:
		g.p.m.count(ctx, g.p.name, countParked)
		if forensic {
			return Parked, nil
		}
		return Parked, g.parkEvent(ctx, tx, key, version, ev)
	}
	if v == gap {
		g.p.m.count(ctx, g.p.name, countAppliedGap)
	} else {
		g.p.m.count(ctx, g.p.name, countApplied)
	}
	if forensic {
		return Applied, nil
	}
	if err := g.cfg.Apply(ctx, tx, ev); err != nil {
		return 0, err
	}
	if g.cfg.Gaps == GapPark {
		return Applied, g.unpark(ctx, tx, key, version)
	}
	return Applied, nil
}

// current reads the entity's version, locking its row unless readOnly.
func (g *Guard[E]) current(ctx context.Context, tx pgx.Tx, key string, readOnly bool) (int64, bool, error) {
	q := g.live
	if g.p.Table(ctx, g.cfg.Table) != g.p.live[g.cfg.Table] {
		q = g.shadow
	}
	sql := q.lock
	if readOnly {
		sql = q.read
	}
	var v int64
	err := tx.QueryRow(ctx, sql, key).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("projection %s: read the version of %s %q: %w", g.p.name, g.cfg.Table, key, err)
	}
	return v, true, nil
}
