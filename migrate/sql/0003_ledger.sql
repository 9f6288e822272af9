-- The side-effect ledger: one row per external effect, recorded in the same
-- transaction as the business write that caused it and carried out afterwards
-- by the dispatcher. Every state change is an UPDATE guarded by status and
-- lock_owner.
CREATE TABLE {{.Table "ledger"}} (
	effect_id       text        PRIMARY KEY,
	effect_type     text        NOT NULL,
	consumer        text        NOT NULL DEFAULT '',
	message_id      text        NOT NULL DEFAULT '',
	business_key    text        NOT NULL,
	target          text        NOT NULL DEFAULT '',
	idempotency_key text        NOT NULL,
	request_hash    bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
	request         bytea       NOT NULL,
	status          text        NOT NULL CHECK (status IN ('pending', 'in_flight', 'succeeded',
	                            'failed_retryable', 'failed_terminal', 'unknown', 'suppressed')),
	attempt_count   integer     NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL DEFAULT now(),
	locked_until    timestamptz,
	lock_owner      text,
	last_error      text        NOT NULL DEFAULT '',
	response_hash   bytea       CHECK (octet_length(response_hash) = 32),
	response        bytea       CHECK (octet_length(response) <= 4096),
	created_at      timestamptz NOT NULL DEFAULT now(),
	completed_at    timestamptz
);

-- Due claims: the dispatcher takes the oldest due rows with SKIP LOCKED.
CREATE INDEX {{.Name "ledger_due_idx"}} ON {{.Table "ledger"}} (next_attempt_at)
	WHERE status IN ('pending', 'failed_retryable');
-- Lease sweeps and reconciliation look at in-flight and unknown rows only.
CREATE INDEX {{.Name "ledger_in_flight_idx"}} ON {{.Table "ledger"}} (locked_until)
	WHERE status = 'in_flight';
CREATE INDEX {{.Name "ledger_unknown_idx"}} ON {{.Table "ledger"}} (next_attempt_at)
	WHERE status = 'unknown';
-- "What did message X cause?"
CREATE INDEX {{.Name "ledger_message_idx"}} ON {{.Table "ledger"}} (consumer, message_id);

-- Every operator decision on an effect, with who, when and why.
CREATE TABLE {{.Table "ledger_audit"}} (
	id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	effect_id   text        NOT NULL,
	operator    text        NOT NULL,
	from_status text        NOT NULL,
	to_status   text        NOT NULL,
	reason      text        NOT NULL,
	resolved_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{.Name "ledger_audit_effect_idx"}} ON {{.Table "ledger_audit"}} (effect_id, resolved_at);
