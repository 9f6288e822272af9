package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Horizon is what retention made one consumer forget of the messages from
// one source (a stream or a queue). A message of that source seen again at
// or below it may have been applied once already with its row since
// deleted: delivered again, it would run the handler again. Every message
// seen after it still has its row.
//
// Each door through which an old message can come back asks the horizon
// first: a normal replay (replay.Options.From), a redrive (deadletters),
// the resume of an online rebuild; Cleanup moves it.
type Horizon struct {
	// Consumer is the consumer's name.
	Consumer string
	// Source is the stream or queue the forgotten messages came from.
	Source string
	// Offset is the highest stream offset at which any copy of a forgotten
	// message was claimed; nil when none had one (messages from a queue).
	Offset *int64
	// SeenAt is the newest last sighting among the forgotten messages: the
	// last time any copy of one of them was claimed.
	SeenAt time.Time
	// UpdatedAt is when a cleanup last moved the horizon.
	UpdatedAt time.Time
}

// ErrBeyondHorizon is wrapped by the *HorizonError a door returns for a
// message that could come back without its inbox row: applied once, its row
// deleted by retention, it would be applied again.
var ErrBeyondHorizon = errors.New("inbox: beyond the retention horizon")

// HorizonError refuses a message, or a range of messages, that could come
// back without its inbox row. It wraps ErrBeyondHorizon.
type HorizonError struct {
	// Horizon is what the consumer forgot.
	Horizon Horizon
	// Offset is the refused stream offset, for CheckOffset.
	Offset *int64
	// At is the refused time, for CheckSeen.
	At time.Time
}

// Error names the horizon and what it refused.
func (e *HorizonError) Error() string {
	h := e.Horizon
	if e.Offset != nil {
		return fmt.Sprintf("%v: consumer %q forgot offsets up to %d of %s (retention, %s); offset %d could be applied again: "+
			"start at %d or later", ErrBeyondHorizon, h.Consumer, *h.Offset, h.Source, stamp(h.UpdatedAt), *e.Offset, *h.Offset+1)
	}
	return fmt.Sprintf("%v: consumer %q forgot messages of %s last seen until %s (retention, %s); a message of %s could be applied again",
		ErrBeyondHorizon, h.Consumer, h.Source, stamp(h.SeenAt), stamp(h.UpdatedAt), stamp(e.At))
}

// Unwrap returns ErrBeyondHorizon.
func (e *HorizonError) Unwrap() error { return ErrBeyondHorizon }

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

const (
	horizonSQL = `SELECT consumer, source, forgotten_offset, forgotten_seen_at, updated_at
FROM %[2]s WHERE consumer = $1 AND source = $2`
	horizonsSQL = `SELECT consumer, source, forgotten_offset, forgotten_seen_at, updated_at
FROM %[2]s WHERE consumer = $1 ORDER BY forgotten_seen_at DESC, source`
)

// Horizon returns what retention deleted of consumer's messages from
// source. ok is false when it never deleted any: the inbox still holds
// every message the consumer applied from source.
func (ib *Inbox) Horizon(ctx context.Context, q Querier, consumer, source string) (h Horizon, ok bool, err error) {
	err = q.QueryRow(ctx, ib.sql.horizon, consumer, source).Scan(&h.Consumer, &h.Source, &h.Offset, &h.SeenAt, &h.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Horizon{}, false, nil
	}
	if err != nil {
		return Horizon{}, false, fmt.Errorf("inbox: horizon of %q on %q: %w", consumer, source, err)
	}
	return h, true, nil
}

// Horizons returns consumer's horizons on every source, the newest
// sighting first; none when retention never deleted any of its rows.
func (ib *Inbox) Horizons(ctx context.Context, q Querier, consumer string) ([]Horizon, error) {
	rows, err := q.Query(ctx, ib.sql.horizons, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: horizons of %q: %w", consumer, err)
	}
	hs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (h Horizon, err error) {
		err = row.Scan(&h.Consumer, &h.Source, &h.Offset, &h.SeenAt, &h.UpdatedAt)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: horizons of %q: %w", consumer, err)
	}
	return hs, nil
}

// CheckOffset returns a *HorizonError when a copy of a message at offset of
// stream source could have lost its row in consumer's inbox: offset is at
// or below the highest offset at which any copy of a forgotten message was
// claimed. A replay that starts after that offset meets only messages whose
// rows are kept or that were never applied.
func (ib *Inbox) CheckOffset(ctx context.Context, q Querier, consumer, source string, offset int64) error {
	h, forgot, err := ib.Horizon(ctx, q, consumer, source)
	if err != nil || !forgot || h.Offset == nil || offset > *h.Offset {
		return err
	}
	return &HorizonError{Horizon: h, Offset: &offset}
}

// CheckSeen returns a *HorizonError when a message that was last seen at
// at (or published then, or dead-lettered then) could have lost its row in
// consumer's inbox: retention deleted a row, from any source, of a message
// seen as late as at. Message ids are unique per consumer, whatever the
// source, so every source's horizon counts.
func (ib *Inbox) CheckSeen(ctx context.Context, q Querier, consumer string, at time.Time) error {
	hs, err := ib.Horizons(ctx, q, consumer)
	if err != nil || len(hs) == 0 || at.After(hs[0].SeenAt) {
		return err
	}
	return &HorizonError{Horizon: hs[0], At: at}
}

// touchSQL records a sighting of one row now.
const touchSQL = `UPDATE %[1]s SET seen_at = now() WHERE consumer = $1 AND message_id = $2`

// Touch records a sighting of messageID in consumer's scope now, as a claim
// that finds its row does, so that retention keeps the row for its whole
// OlderThan from now on. A door through which a message comes back later
// touches its row before it asks the horizon (deadletters.Redrive does): a
// clean-up that deletes the row first records the horizon that refuses the
// message, and one that comes after finds the row too young. It reports
// whether the row exists; a clean-up deleting it meanwhile is waited for.
// A consumer or message id no row can have (empty, too long, not text)
// reports false.
func (ib *Inbox) Touch(ctx context.Context, q Execer, consumer, messageID string) (bool, error) {
	if ib.validateKey(0, consumer, messageID) != nil {
		return false, nil
	}
	if q, ok := q.(Querier); ok {
		if p, err := ib.isPartitioned(ctx, q); err != nil || p {
			if err != nil {
				return false, err
			}
			return ib.touchPartitioned(ctx, q.(Execer), consumer, messageID)
		}
	}
	tag, err := q.Exec(ctx, ib.sql.touch, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("inbox: touch %q of %q: %w", messageID, consumer, err)
	}
	return tag.RowsAffected() == 1, nil
}
