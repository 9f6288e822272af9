-- The inbox: one row per (consumer, message id) that a consumer committed.
CREATE TABLE {{.Table "inbox"}} (
	consumer      text        NOT NULL,
	message_id    text        NOT NULL,
	payload_hash  bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
	business_key  text,
	source        text        NOT NULL DEFAULT '',
	stream_offset bigint,
	received_at   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id)
);

-- Retention cleanup walks rows by age.
CREATE INDEX {{.Name "inbox_received_at_idx"}} ON {{.Table "inbox"}} (received_at);
