package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Horizon is what Cleanup made one consumer forget of the messages from one
// source (a stream or a queue). Messages at or below it were applied once and
// their inbox rows are gone: delivered again, they would run the handler
// again.
type Horizon struct {
	// Consumer is the consumer's name.
	Consumer string
	// Source is the stream or queue the forgotten messages came from.
	Source string
	// Offset is the highest stream offset among the deleted rows; nil when
	// none had one (messages from a queue).
	Offset *int64
	// ReceivedAt is the newest receipt among the deleted rows.
	ReceivedAt time.Time
	// UpdatedAt is when a cleanup last moved the horizon.
	UpdatedAt time.Time
}

const horizonSQL = `SELECT consumer, source, forgotten_offset, forgotten_received_at, updated_at
FROM %[2]s WHERE consumer = $1 AND source = $2`

// Horizon returns what Cleanup deleted of consumer's messages from source.
// ok is false when Cleanup never deleted any: the inbox still holds every
// message the consumer applied from source.
func (ib *Inbox) Horizon(ctx context.Context, q Querier, consumer, source string) (h Horizon, ok bool, err error) {
	err = q.QueryRow(ctx, ib.sql.horizon, consumer, source).Scan(
		&h.Consumer, &h.Source, &h.Offset, &h.ReceivedAt, &h.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Horizon{}, false, nil
	}
	if err != nil {
		return Horizon{}, false, fmt.Errorf("inbox: horizon of %q on %q: %w", consumer, source, err)
	}
	return h, true, nil
}
