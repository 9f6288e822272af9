package deadletters

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// countSQL counts one consumer's dead letters through the (consumer,
// message_id) index: work in proportion to what it counts.
const countSQL = `SELECT count(*) FROM %s WHERE consumer = $1`

// Count returns how many dead letters the consumer (an inbox scope, such
// as a rebuild run's) has in tables.
func Count(ctx context.Context, q Querier, tables idem.Tables, consumer string) (int64, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(countSQL, tables.WithDefaults().Table("dead_letters")), consumer)
	if err != nil {
		return 0, fmt.Errorf("deadletters: count %s: %w", consumer, err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("deadletters: count %s: %w", consumer, err)
	}
	return n, nil
}
