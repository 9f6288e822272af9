package replay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chunked"
	"github.com/idemkit/idem/internal/store"
)

// deleteFinishedSQL deletes one chunk of runs finished or abandoned before
// $1, with their audit rows and their progress checkpoints.
const deleteFinishedSQL = `WITH doomed AS (
	SELECT run_id FROM {replay_runs} WHERE status IN ('finished', 'abandoned') AND finished_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
), gone AS (
	DELETE FROM {replay_runs} AS r USING doomed WHERE r.run_id = doomed.run_id RETURNING r.run_id, r.consumer
), audit AS (
	DELETE FROM {replay_audit} AS a USING gone WHERE a.run_id = gone.run_id RETURNING 1
), progress AS (
	{delete_checkpoints}
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM audit), (SELECT count(*) FROM progress)`

// DeleteFinishedRuns deletes the runs of tables finished (or abandoned)
// before cutoff, with their audit rows and their progress checkpoints, chunk
// runs per statement, each its own transaction. Running (or interrupted,
// resumable) runs are kept. It returns how many runs, audit rows and
// checkpoints it deleted (so far, when it fails). The retention package
// (`idem cleanup`) calls it with its cutoff.
func DeleteFinishedRuns(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, cutoff time.Time, chunk int) (runs, audits, checkpoints int64, err error) {
	if err := tables.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("replay: %w", err)
	}
	sql := strings.NewReplacer("{replay_runs}", tables.Table("replay_runs"), "{replay_audit}", tables.Table("replay_audit"),
		"{delete_checkpoints}", store.DeleteCheckpointsSQL(tables, "gone", runScopeSQL("gone"))).Replace(deleteFinishedSQL)
	n, err := chunked.Delete(ctx, pool, sql, cutoff, chunk, 3)
	if err != nil {
		err = fmt.Errorf("replay: delete runs finished before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return n[0], n[1], n[2], err
}
