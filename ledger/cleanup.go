package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chunked"
)

// deleteSettledSQL deletes one chunk of effects settled before $1, with
// their audit rows: succeeded, suppressed, and failed_terminal once an
// operator resolved them so. It picks them FOR UPDATE SKIP LOCKED, so it
// never waits on a dispatcher writing an outcome or an operator resolving.
const deleteSettledSQL = `WITH doomed AS (
	SELECT effect_id FROM {ledger} AS l
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed')
		AND coalesce(completed_at, created_at) < $1
		AND (status <> 'failed_terminal' OR (SELECT a.to_status FROM {ledger_audit} AS a
			WHERE a.effect_id = l.effect_id ORDER BY a.resolved_at DESC, a.id DESC LIMIT 1) = 'failed_terminal')
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {ledger} AS l USING doomed WHERE l.effect_id = doomed.effect_id RETURNING l.effect_id
), audit AS (
	DELETE FROM {ledger_audit} AS a USING gone WHERE a.effect_id = gone.effect_id RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit)`

// DeleteSettled deletes the effects of tables settled before cutoff, with
// their audit rows, chunk effects per statement, each its own transaction:
// succeeded, suppressed, and failed_terminal once an operator resolved them
// so. Pending, in-flight, retryable, unknown and unresolved failed_terminal
// effects are never deleted. It returns how many effects and audit rows it
// deleted (so far, when it fails). The retention package (`idem cleanup`)
// calls it with its cutoff.
func DeleteSettled(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (effects, audits int64, err error) {
	if err := tables.Validate(); err != nil {
		return 0, 0, fmt.Errorf("ledger: %w", err)
	}
	sql := strings.NewReplacer("{ledger}", tables.Table("ledger"), "{ledger_audit}", tables.Table("ledger_audit")).Replace(deleteSettledSQL)
	n, err := chunked.Delete(ctx, pool, sql, cutoff, chunk, 2)
	if err != nil {
		err = fmt.Errorf("ledger: delete effects settled before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], n[1], err
}
