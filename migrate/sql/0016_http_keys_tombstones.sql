-- An expired HTTP idempotency key is kept as a tombstone until forget_at, so
-- that a late retry with it is refused (422 IDEMPOTENCY_KEY_EXPIRED) instead
-- of running its handler again; retention deletes a record once forget_at
-- has passed. A record written before this version has no forget_at and is
-- forgotten at its expiry, as it was before.
ALTER TABLE {{.Table "http_keys"}} ADD COLUMN forget_at timestamptz;

-- Retention walks the records it may delete in the order they are
-- forgotten; an unknown outcome is never deleted, so it stays out of the
-- index. This index replaces the one on expires_at, which nothing reads.
CREATE INDEX {{.Name "http_keys_forget_idx"}} ON {{.Table "http_keys"}} ((coalesce(forget_at, expires_at)))
	WHERE state <> 'unknown';
DROP INDEX {{.QuotedSchema}}.{{.Name "http_keys_expires_at_idx"}};
