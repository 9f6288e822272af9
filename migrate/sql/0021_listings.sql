-- The operator's listings read what they print: each filter a listing
-- offers has an index in the listing's order, so a page walks the index
-- from its cursor and stops after its last row, however deep the history.

-- deadletters.List: newest first (id), all, or by consumer or by reason
-- (by both, through the consumer's, filtering on the reason).
CREATE INDEX {{.Name "dead_letters_consumer_id_idx"}} ON {{.Table "dead_letters"}} (consumer, id);
-- The reason's index is on reason COLLATE "C", which only the listing asks
-- for: the groups' walk (deadletters.Groups) compares reasons in the
-- column's own collation and keeps to its own index, which it reads a few
-- entries of per group; on a (reason, id) index it would read them all.
CREATE INDEX {{.Name "dead_letters_reason_id_idx"}} ON {{.Table "dead_letters"}} ((reason COLLATE "C"), id);

-- ledger.List: oldest first (created_at, effect_id), all, by status or by
-- consumer; Stats counts a rare status through the status index.
CREATE INDEX {{.Name "ledger_created_idx"}} ON {{.Table "ledger"}} (created_at, effect_id);
CREATE INDEX {{.Name "ledger_status_created_idx"}} ON {{.Table "ledger"}} (status, created_at, effect_id);
CREATE INDEX {{.Name "ledger_consumer_created_idx"}} ON {{.Table "ledger"}} (consumer, created_at, effect_id);

-- httpinbox.Keys.List: oldest first (created_at, key_id), all or by state;
-- by caller through http_keys_caller_idx.
CREATE INDEX {{.Name "http_keys_created_idx"}} ON {{.Table "http_keys"}} (created_at, key_id);
CREATE INDEX {{.Name "http_keys_state_created_idx"}} ON {{.Table "http_keys"}} (state, created_at, key_id);

-- httpinbox.Operations.List: oldest first (created_at, operation_id), all
-- or by state.
CREATE INDEX {{.Name "http_operations_created_idx"}} ON {{.Table "http_operations"}} (created_at, operation_id);
CREATE INDEX {{.Name "http_operations_state_created_idx"}} ON {{.Table "http_operations"}} (state, created_at, operation_id);

-- replay.ListRuns: newest first. A run counts what it audits as it writes
-- the audit rows, so a listing reads one row per run, not its audit; the
-- counts of earlier runs are taken once, here.
CREATE INDEX {{.Name "replay_runs_started_idx"}} ON {{.Table "replay_runs"}} (started_at, run_id);
ALTER TABLE {{.Table "replay_runs"}}
	ADD COLUMN audited bigint NOT NULL DEFAULT 0,
	ADD COLUMN dead_lettered bigint NOT NULL DEFAULT 0;
UPDATE {{.Table "replay_runs"}} AS r SET audited = a.audited, dead_lettered = a.dead_lettered
FROM (SELECT run_id, count(*) AS audited, count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered
	FROM {{.Table "replay_audit"}} GROUP BY run_id) AS a
WHERE a.run_id = r.run_id;
