-- HTTP idempotency keys: one row per (tenant, caller, operation, key), keyed by
-- key_id = SHA-256 of that scope (see httpinbox.KeyID), so that long tenant or
-- caller values never exceed an index entry. A request claims its key with
-- INSERT … ON CONFLICT DO NOTHING as 'started' under a lease; the handler's
-- transaction stores the response and the final state together with the
-- business write.
CREATE TABLE {{.Table "http_keys"}} (
	key_id          bytea       PRIMARY KEY CHECK (octet_length(key_id) = 32),
	tenant          text        NOT NULL,
	caller          text        NOT NULL,
	operation       text        NOT NULL,
	idempotency_key text        NOT NULL,
	fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
	state           text        NOT NULL DEFAULT 'started'
	                CHECK (state IN ('started', 'completed', 'failed_replayable', 'unknown')),
	lock_owner      uuid,
	locked_until    timestamptz,
	attempts        integer     NOT NULL DEFAULT 1,
	status_code     integer,
	headers         jsonb,
	body            bytea,
	body_omitted    boolean     NOT NULL DEFAULT false,
	resource_id     text        NOT NULL DEFAULT '',
	created_at      timestamptz NOT NULL DEFAULT now(),
	completed_at    timestamptz,
	expires_at      timestamptz NOT NULL
);

-- Retention cleanup walks keys by expiry.
CREATE INDEX {{.Name "http_keys_expires_at_idx"}} ON {{.Table "http_keys"}} (expires_at);
-- The per-caller limit on new keys counts a caller's recent keys.
CREATE INDEX {{.Name "http_keys_caller_idx"}} ON {{.Table "http_keys"}} (tenant, caller, created_at);
