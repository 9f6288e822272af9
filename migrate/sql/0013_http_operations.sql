-- Long-running operations accepted at the HTTP edge (202 Accepted with a
-- Location to poll): one row per operation, created in the transaction of
-- the request that accepted it, and moved accepted → running → succeeded |
-- failed | unknown by guarded updates, or by the outcome of the ledger
-- effect it follows. fields and result are the JSON the status document
-- shows, kept byte for byte (json, not jsonb).
CREATE TABLE {{.Table "http_operations"}} (
	operation_id text        COLLATE "C" PRIMARY KEY,
	tenant       text        NOT NULL,
	caller       text        NOT NULL,
	kind         text        NOT NULL,
	key_id       bytea       CHECK (octet_length(key_id) = 32),
	state        text        NOT NULL DEFAULT 'accepted'
	             CHECK (state IN ('accepted', 'running', 'succeeded', 'failed', 'unknown')),
	follows      text,
	location     text        NOT NULL,
	fields       json        NOT NULL,
	result       json,
	created_at   timestamptz NOT NULL DEFAULT now(),
	updated_at   timestamptz NOT NULL DEFAULT now(),
	finished_at  timestamptz,
	expires_at   timestamptz NOT NULL
);

-- Retention deletes finished operations past their expiry; the others stay.
CREATE INDEX {{.Name "http_operations_expires_idx"}} ON {{.Table "http_operations"}} (expires_at)
	WHERE state IN ('succeeded', 'failed');
