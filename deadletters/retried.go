package deadletters

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// markRetriedSQL marks the consumer's unmarked dead-letter rows of the
// messages $2 as retried by $3, through the (consumer, message_id) index.
const markRetriedSQL = `UPDATE %s SET redriven_at = now(), redriven_by = $3
WHERE consumer = $1 AND message_id = ANY($2::text[]) AND redriven_at IS NULL`

// MarkRetried marks, in tx, the dead-letter rows of consumer's messages ids
// that nobody marked yet as retried (redriven_at, redriven_by = by), and
// returns how many it marked. A stream has no dead-letter queue to redrive
// from: a repair replay that processes a dead-lettered stream message again
// marks its rows with it, in the transaction that commits the message, so
// that `idem deadletters list` shows it was retried.
func MarkRetried(ctx context.Context, tx pgx.Tx, tables idem.Tables, consumer string, ids []string, by string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(markRetriedSQL, tables.WithDefaults().Table("dead_letters")), consumer, ids, by)
	if err != nil {
		return 0, fmt.Errorf("deadletters: mark %d messages of %s retried: %w", len(ids), consumer, err)
	}
	return tag.RowsAffected(), nil
}
