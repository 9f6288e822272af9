package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/safetext"
	"github.com/idemkit/idem/internal/store"
)

// run is a row of the replay_runs table: what a run fixed when it started.
type run struct {
	id, mode, consumer, stream string
	from, to                   string
	end                        int64
	live, handoff              *int64
	keys, ids                  []string
	redispatch                 bool
	operator, reason           string
	status                     string
	// An online rebuild's projection: its name, schema and live tables.
	projection, schema *string
	tables             []string
}

const runColumns = `run_id, mode, consumer, stream, from_position, to_position, end_offset, live_offset,
	handoff_offset, select_keys, select_ids, redispatch, operator, reason, status,
	projection, projection_schema, projection_tables`

const (
	insertRunSQL = `INSERT INTO %s (` + runColumns + `)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`
	getRunSQL = `SELECT ` + runColumns + ` FROM %s WHERE run_id = $1`
	// finishRunSQL ends a run; an online rebuild's end is where it swapped.
	finishRunSQL = `UPDATE %s SET status = 'finished', finished_at = now(), handoff_offset = $2,
	end_offset = coalesce($2, end_offset)
WHERE run_id = $1 AND status = 'running'`
)

func (r *runner) insertRun(ctx context.Context, tx pgx.Tx, row *run) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(insertRunSQL, r.tables.Table("replay_runs")),
		row.id, row.mode, row.consumer, row.stream, row.from, row.to, row.end, row.live, row.handoff,
		nonNil(row.keys), nonNil(row.ids), row.redispatch, row.operator, row.reason, row.status,
		row.projection, row.schema, row.tables)
	if err != nil {
		return fmt.Errorf("replay: register run %s: %w", row.id, err)
	}
	return nil
}

// getRun returns the run with id, or nil when there is none.
func (r *runner) getRun(ctx context.Context, id string) (*run, error) {
	return loadRun(ctx, r.pool, r.tables, id)
}

// loadRun returns the run with id in tables, or nil when there is none.
func loadRun(ctx context.Context, q store.Querier, tables idem.Tables, id string) (*run, error) {
	row := &run{}
	err := q.QueryRow(ctx, fmt.Sprintf(getRunSQL, tables.Table("replay_runs")), id).Scan(
		&row.id, &row.mode, &row.consumer, &row.stream, &row.from, &row.to, &row.end, &row.live,
		&row.handoff, &row.keys, &row.ids, &row.redispatch, &row.operator, &row.reason, &row.status,
		&row.projection, &row.schema, &row.tables)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("replay: load run %s: %w", id, err)
	}
	return row, nil
}

func (r *runner) finishRun(ctx context.Context, tx pgx.Tx, handoff *int64) error {
	tag, err := tx.Exec(ctx, fmt.Sprintf(finishRunSQL, r.tables.Table("replay_runs")), r.row.id, handoff)
	if err != nil {
		return fmt.Errorf("replay: finish run %s: %w", r.row.id, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("replay: finish run %s: another process finished it", r.row.id)
	}
	if r.row.mode == string(idem.Rebuild) {
		if err := r.ib.Release(ctx, tx, rebuildScope(r.row.consumer, r.row.id)); err != nil {
			return fmt.Errorf("replay: finish run %s: %w", r.row.id, err)
		}
	}
	return nil
}

// insertAuditSQL writes a repair batch's audit rows in one statement.
// insertAuditSQL writes a batch's audit rows and adds them to the run's
// counts, which its listing reads instead of the audit.
const insertAuditSQL = `WITH audited AS (
	INSERT INTO %[1]s
		(run_id, consumer, stream, stream_offset, message_id, business_key, payload_hash, inbox, outcome, error, operator, reason)
	SELECT $1, $2, $3, t.stream_offset, t.message_id, NULLIF(t.business_key, ''), t.payload_hash, t.inbox, t.outcome, t.error, $4, $5
	FROM unnest($6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::text[], $12::text[])
		AS t(stream_offset, message_id, business_key, payload_hash, inbox, outcome, error)
	RETURNING outcome
)
UPDATE %[2]s SET audited = audited + (SELECT count(*) FROM audited),
	dead_lettered = dead_lettered + (SELECT count(*) FROM audited WHERE outcome = 'dead_lettered')
WHERE run_id = $1`

// audit writes an audit row for each settled, selected message of the batch.
func (r *runner) audit(ctx context.Context, tx pgx.Tx, items []*engine.Item, res []engine.Result) error {
	var (
		offsets                                []int64
		ids, keys, inboxes, results, errorsTxt []string
		hashes                                 [][]byte
		processed                              []string
	)
	for i, it := range items {
		o := res[i]
		if o.Outcome != idem.Processed && o.Outcome != idem.DeadLettered {
			continue // skipped (not selected) or retried (audited when settled)
		}
		m := it.Message
		h := m.Hash
		offsets = append(offsets, it.Offset)
		ids = append(ids, m.ID)
		keys = append(keys, m.BusinessKey)
		hashes = append(hashes, h[:])
		inbox := ""
		if o.Inbox != 0 {
			inbox = o.Inbox.String()
		}
		inboxes = append(inboxes, inbox)
		results = append(results, o.Outcome.String())
		errorsTxt = append(errorsTxt, safetext.Error(o.Err))
		if o.Outcome == idem.Processed {
			processed = append(processed, m.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(insertAuditSQL, r.tables.Table("replay_audit"), r.tables.Table("replay_runs")),
		r.row.id, r.cfg.Name, r.o.Stream, r.row.operator, r.row.reason,
		offsets, ids, keys, hashes, inboxes, results, errorsTxt)
	if err != nil {
		return fmt.Errorf("replay: write %d audit rows: %w", len(ids), err)
	}
	// A stream's dead letters have no queue to redrive from: a repair that
	// processes them again is their retry, and marks their rows.
	by := fmt.Sprintf("repair %s by %s", r.row.id, r.row.operator)
	if _, err := deadletters.MarkRetried(ctx, tx, r.tables, r.cfg.Name, processed, by); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// rerunIDsSQL lists the messages a repair run re-ran successfully.
const rerunIDsSQL = `SELECT DISTINCT message_id FROM %s WHERE run_id = $1 AND outcome = 'processed' ORDER BY 1`

// newRunID returns a sortable, unique run id: UTC time and random hex.
func newRunID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return now.UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// runScope is the checkpoint scope of run id of consumer name.
func runScope(name, id string) string { return name + "@replay:" + id }

// runScopeSQL is runScope in SQL, over the consumer and run_id columns of
// the rows of from.
func runScopeSQL(from string) string { return from + ".consumer || '@replay:' || " + from + ".run_id" }

// rebuildScope is the private inbox scope of rebuild run id.
func rebuildScope(name, id string) string { return name + "@rebuild:" + id }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }
