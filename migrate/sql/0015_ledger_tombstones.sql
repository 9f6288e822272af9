-- The ledger's horizon. When retention deletes a settled effect (succeeded,
-- suppressed, or failed_terminal as an operator resolved it) it leaves a
-- tombstone here, in the same statement: which effect, under which key, how
-- it settled, when, and when its row went. Record probes this primary key
-- in the statement that inserts an effect, and an effect recorded again
-- under a forgotten id (a repair, a rebuild, a redrive after retention) is
-- written as suppressed: never sent twice. Nothing else is kept, so that a
-- tombstone costs about a hundred bytes and one key entry at 10^8 of them.
CREATE TABLE {{.Table "ledger_tombstones"}} (
	effect_id       text        COLLATE "C" PRIMARY KEY,
	idempotency_key text        NOT NULL,
	status          text        NOT NULL CHECK (status IN ('succeeded', 'failed_terminal', 'suppressed')),
	settled_at      timestamptz NOT NULL,
	deleted_at      timestamptz NOT NULL DEFAULT now()
);

-- Tombstones are kept unless retention is told otherwise; then it deletes
-- them by deletion time, walking this index from where its last chunk
-- stopped. They arrive in that order, a retention chunk's share one value,
-- so the index only appends and deduplicates to a few bytes a tombstone.
CREATE INDEX {{.Name "ledger_tombstones_deleted_idx"}} ON {{.Table "ledger_tombstones"}} (deleted_at);

-- Ledger retention walks the settled effects by the time they settled, each
-- chunk from where the one before it stopped, so that its work grows with
-- the effects it deletes, not with the ledger. An effect enters the index
-- once, when it settles. On a large ledger this build blocks the ledger's
-- writes while it runs: apply it while the workers are stopped, or create
-- the index CONCURRENTLY beforehand under this name.
CREATE INDEX IF NOT EXISTS {{.Name "ledger_settled_idx"}} ON {{.Table "ledger"}} ((coalesce(completed_at, created_at)))
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed');
