package console

// The console's own queries. All of them read; each is bounded by an index
// and a LIMIT, so that a page costs the same with a million rows as with a
// hundred (TestEveryPageAnswersFastAtDepth checks the plans and the time).
// Where no index lets a question be answered exactly at that cost (dead
// letters grouped by reason, failed effects nobody resolved), the query
// reads a window of the newest rows, and the page says how far it looked
// and lets the operator look further.

// consumersSQL lists the consumers of {t} with a skip scan of its
// (consumer, message_id) index, one probe per consumer.
const consumersSQL = `WITH RECURSIVE c(consumer) AS (
	(SELECT consumer FROM {t} ORDER BY consumer LIMIT 1)
	UNION ALL
	SELECT (SELECT t.consumer FROM {t} AS t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1)
	FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL LIMIT $1`

// recentInboxSQL reads the newest $2 inbox rows received since $1 (the
// received_at index) and counts them per consumer and source, with those
// a later copy was claimed for (duplicates) since $1, and the oldest
// receipt the window reached.
const recentInboxSQL = `SELECT consumer, source, count(*), count(*) FILTER (WHERE seen_at >= $1), min(received_at)
FROM (SELECT consumer, source, seen_at, received_at FROM {inbox}
	WHERE received_at >= $1 ORDER BY received_at DESC LIMIT $2) AS w
GROUP BY consumer, source`

// recentDeadSQL reads the newest $2 dead letters since $1 (the
// dead_lettered_at index) and counts them per consumer and source, and the
// payload conflicts among them.
const recentDeadSQL = `SELECT consumer, source, count(*), count(*) FILTER (WHERE reason = 'payload_conflict'), min(dead_lettered_at)
FROM (SELECT consumer, source, reason, dead_lettered_at FROM {dl}
	WHERE dead_lettered_at >= $1 ORDER BY dead_lettered_at DESC LIMIT $2) AS w
GROUP BY consumer, source`

// checkpointsSQL lists the live consumers' stream checkpoints (a replay
// run's are under "<consumer>@replay:<run_id>", shown with its run).
const checkpointsSQL = `SELECT consumer, stream, last_offset, updated_at FROM {checkpoints}
WHERE strpos(consumer, '@replay:') = 0 ORDER BY consumer, stream LIMIT $1`

// newestTombstoneSQL is when ledger retention last removed an effect (the
// deleted_at index).
const newestTombstoneSQL = `SELECT max(deleted_at) FROM {tombstones}`

// runProgressSQL reads the checkpoints of replay runs: a run's progress is
// its checkpoint under "<consumer>@replay:<run_id>" (replay.runScope).
const runProgressSQL = `SELECT r.run_id, c.last_offset, c.updated_at
FROM unnest($1::text[], $2::text[], $3::text[]) AS r(run_id, consumer, stream)
JOIN {checkpoints} AS c ON c.consumer = r.consumer || '@replay:' || r.run_id AND c.stream = r.stream`

// groupWindowSQL groups the newest $1 dead letters (the primary key,
// backwards) by consumer, reason and source: those still in the
// dead-letter queue (not redriven), with their oldest and newest, and those
// redriven.
const groupWindowSQL = `SELECT consumer, reason, source,
	count(*) FILTER (WHERE redriven_at IS NULL), count(*) FILTER (WHERE redriven_at IS NOT NULL),
	min(dead_lettered_at) FILTER (WHERE redriven_at IS NULL), max(dead_lettered_at) FILTER (WHERE redriven_at IS NULL),
	min(dead_lettered_at), min(id)
FROM (SELECT id, consumer, reason, source, dead_lettered_at, redriven_at FROM {dl} ORDER BY id DESC LIMIT $1) AS w
GROUP BY consumer, reason, source
ORDER BY count(*) FILTER (WHERE redriven_at IS NULL) DESC, consumer, reason, source`

// estimateGroupSQL is the query whose row estimate sizes a group beyond
// the window (the planner's statistics of consumer and reason).
const estimateGroupSQL = `SELECT 1 FROM {dl} WHERE consumer = $1 AND reason = $2 AND redriven_at IS NULL`

// deadColumns are the columns of a dead letter the list shows: not the
// payload.
const deadColumns = `id, consumer, message_id, payload_hash, reason, error, source, attempts, dead_lettered_at,
	redriven_at, coalesce(redriven_by, ''), payload IS NOT NULL, exchange, routing_key, stored_hash`

// deadWindowSQL reads the $2 dead letters below id $1, newest first (the
// primary key), and returns how many it read, the lowest id it reached,
// and the ids of the first $6 among them of consumer $3 and reason $4
// (when given), still in the dead-letter queue unless $5.
const deadWindowSQL = `SELECT count(*), coalesce(min(id), 0),
	coalesce((array_agg(id ORDER BY id DESC) FILTER (WHERE ($3 = '' OR consumer = $3) AND ($4 = '' OR reason = $4)
		AND ($5 OR redriven_at IS NULL)))[1:$6], '{}')
FROM (SELECT id, consumer, reason, redriven_at FROM {dl} WHERE id < $1 ORDER BY id DESC LIMIT $2) AS w`

// deadRowsSQL reads dead letters by id.
const deadRowsSQL = `SELECT {dlcols} FROM {dl} WHERE id = ANY($1::bigint[]) ORDER BY id DESC`

// deadByIDSQL finds a message id's dead letters among consumers $1 (the
// (consumer, message_id) index), newest first.
const deadByIDSQL = `SELECT {dlcols} FROM {dl} WHERE consumer = ANY($1::text[]) AND message_id = $2
	AND ($3 = '' OR reason = $3) AND ($4 OR redriven_at IS NULL) AND id < $5
ORDER BY id DESC LIMIT $6`

// discardSQL marks dead letters discarded: the dead-letter table has no
// column of its own for it (see Console.discard), so it takes the redrive
// marking, which Redrive reads as "this row is settled": redriven_by says
// "discarded by <operator>: <reason>". Only rows not yet settled.
const discardSQL = `UPDATE {dl} SET redriven_at = now(), redriven_by = $2
WHERE id = ANY($1::bigint[]) AND redriven_at IS NULL RETURNING id`

// entryColumns are the columns of an effect a list shows: not the request
// or the response.
const entryColumns = `effect_id, effect_type, consumer, message_id, business_key, target, status, attempt_count,
	next_attempt_at, last_error, created_at, completed_at`

// unknownPageSQL is a page of unknown effects, the longest waiting first
// (the unknown index on next_attempt_at: the time the outcome became
// unknown, or of the last lookup), after the key ($1, $2).
const unknownPageSQL = `SELECT {entry} FROM {ledger}
WHERE status = 'unknown' AND next_attempt_at >= $1 AND (next_attempt_at > $1 OR effect_id > $2)
ORDER BY next_attempt_at, effect_id LIMIT $3`

// duePageSQL is a page of effects waiting for the dispatcher (pending and
// failed_retryable), the longest due first (the due index).
const duePageSQL = `SELECT {entry} FROM {ledger}
WHERE status IN ('pending', 'failed_retryable') AND next_attempt_at >= $1 AND (next_attempt_at > $1 OR effect_id > $2)
ORDER BY next_attempt_at, effect_id LIMIT $3`

// terminalWindowSQL reads the $3 settled effects before the key ($1, $2),
// newest settled first (the settled index), and returns how many it read,
// the key it stopped at, and the first $4 failed_terminal effects among
// them that no operator resolved as failed_terminal (the ones retention
// keeps; ledger.DeleteSettled). The failed ones are set apart before their
// audit rows are looked up, so that the planner prices the lookups for
// them alone (priced for the whole window, the statement would be
// compiled by JIT, which costs more than running it).
const terminalWindowSQL = `WITH w AS MATERIALIZED (
	SELECT effect_id, status, coalesce(completed_at, created_at) AS settled FROM {ledger}
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed')
		AND coalesce(completed_at, created_at) <= $1 AND (coalesce(completed_at, created_at) < $1 OR effect_id < $2)
	ORDER BY coalesce(completed_at, created_at) DESC, effect_id DESC LIMIT $3
), last AS (SELECT settled, effect_id FROM w ORDER BY settled, effect_id LIMIT 1),
failed AS MATERIALIZED (SELECT effect_id, settled FROM w WHERE status = 'failed_terminal')
SELECT (SELECT count(*) FROM w), (SELECT settled FROM last), coalesce((SELECT effect_id FROM last), ''),
	coalesce((SELECT array_agg(effect_id ORDER BY settled DESC, effect_id DESC) FROM (
		SELECT effect_id, settled FROM failed AS f
		WHERE coalesce((SELECT a.to_status FROM {audit} AS a WHERE a.effect_id = f.effect_id
			ORDER BY a.resolved_at DESC, a.id DESC LIMIT 1), '') <> 'failed_terminal'
		ORDER BY settled DESC, effect_id DESC LIMIT $4) AS hit), '{}')`

// effectsByIDSQL reads effects by id.
const effectsByIDSQL = `SELECT {entry} FROM {ledger} WHERE effect_id = ANY($1::text[])`

// countUnknownSQL and countDueSQL count up to countThreshold+1 effects
// through their index.
const (
	countUnknownSQL = `SELECT count(*) FROM (SELECT 1 FROM {ledger} WHERE status = 'unknown'
	ORDER BY next_attempt_at LIMIT 1001) AS x`
	countDueSQL = `SELECT count(*) FROM (SELECT 1 FROM {ledger} WHERE status IN ('pending', 'failed_retryable')
	ORDER BY next_attempt_at LIMIT 1001) AS x`
)

// estimateTerminalSQL is the query whose row estimate sizes the
// failed_terminal effects (no index counts them).
const estimateTerminalSQL = `SELECT 1 FROM {ledger} WHERE status = 'failed_terminal'`

// countTerminalSQL counts the failed_terminal effects nobody resolved: run
// only on a ledger small enough to count (see store.terminalCount).
const countTerminalSQL = `SELECT count(*) FROM {ledger} AS l WHERE status = 'failed_terminal'
	AND coalesce((SELECT a.to_status FROM {audit} AS a WHERE a.effect_id = l.effect_id
		ORDER BY a.resolved_at DESC, a.id DESC LIMIT 1), '') <> 'failed_terminal'`

// reltuplesSQL is the planner's row count of table $2 in schema $1: for a
// partitioned table (the partitioned inbox), the sum of its partitions',
// since autovacuum analyses the partitions and never their parent; -1
// when nothing was analysed.
const reltuplesSQL = `SELECT coalesce((SELECT CASE WHEN c.relkind <> 'p' THEN c.reltuples ELSE (
		SELECT CASE WHEN bool_and(p.reltuples < 0) THEN -1 ELSE sum(greatest(p.reltuples, 0)) END
		FROM pg_partition_tree(c.oid) AS t JOIN pg_class AS p ON p.oid = t.relid WHERE t.isleaf) END
	FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
	WHERE n.nspname = $1 AND c.relname = $2), -1)::float8`

// advisorySQL lists the advisory locks held in this database on bigint
// keys, with their sessions: partlease's partition and member locks among
// them.
const advisorySQL = `SELECT (l.classid::bigint << 32) | l.objid::bigint, l.mode, l.pid,
	coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start
FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
LIMIT 100000`
