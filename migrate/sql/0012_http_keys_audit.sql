-- What an operator decided about an HTTP idempotency key (`idem http-keys
-- resolve`): an unknown outcome confirmed as completed, or a key handed back
-- so that the client's next request runs it again. The rows go with their
-- key when retention deletes it.
CREATE TABLE {{.Table "http_keys_audit"}} (
	id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key_id     bytea       NOT NULL REFERENCES {{.Table "http_keys"}} (key_id) ON DELETE CASCADE,
	operator   text        NOT NULL,
	from_state text        NOT NULL,
	to_state   text        NOT NULL,
	reason     text        NOT NULL,
	at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Name "http_keys_audit_key_idx"}} ON {{.Table "http_keys_audit"}} (key_id);

-- The gauges and the operator's lists look for the oldest key in progress
-- and the oldest unknown outcome; both are few among many completed keys.
CREATE INDEX {{.Name "http_keys_started_idx"}} ON {{.Table "http_keys"}} (created_at)
	WHERE state = 'started';
CREATE INDEX {{.Name "http_keys_unknown_idx"}} ON {{.Table "http_keys"}} (completed_at)
	WHERE state = 'unknown';
