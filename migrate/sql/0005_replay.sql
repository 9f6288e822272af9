-- Replay runs: one row per bounded replay that writes (normal, rebuild,
-- repair; a forensic replay writes nothing). The end is fixed when the run
-- starts, so a run resumed after a crash (same run_id) stops where the first
-- attempt would have. The run's progress is its checkpoint, under the
-- consumer name "<consumer>@replay:<run_id>", written in each batch's
-- transaction.
CREATE TABLE {{.Table "replay_runs"}} (
	run_id         text        PRIMARY KEY,
	mode           text        NOT NULL CHECK (mode IN ('normal', 'rebuild', 'repair')),
	consumer       text        NOT NULL,
	stream         text        NOT NULL,
	from_position  text        NOT NULL,
	to_position    text        NOT NULL,
	-- The last offset the run reads: the tail (or the given end) at start;
	-- -1 when the range was empty.
	end_offset     bigint      NOT NULL,
	-- rebuild: the live consumer's checkpoint when the run started (-1: none).
	-- Messages after it were never processed live and are caught up like the
	-- live consumer would, effects dispatched.
	live_offset    bigint,
	-- rebuild: where the live consumer continues (its checkpoint is moved here).
	handoff_offset bigint,
	-- repair: the selection, who and why, and whether failed / unknown effects
	-- of the selected messages are sent again.
	select_keys    text[]      NOT NULL DEFAULT '{}',
	select_ids     text[]      NOT NULL DEFAULT '{}',
	redispatch     boolean     NOT NULL DEFAULT false,
	operator       text        NOT NULL DEFAULT '',
	reason         text        NOT NULL DEFAULT '',
	status         text        NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'finished')),
	started_at     timestamptz NOT NULL DEFAULT now(),
	finished_at    timestamptz
);

CREATE INDEX {{.Name "replay_runs_consumer_idx"}} ON {{.Table "replay_runs"}} (consumer, stream, started_at);

-- Repair audit: one row per selected message a repair run settled, written in
-- the transaction that re-ran it. "What happened to message X" from SQL alone.
CREATE TABLE {{.Table "replay_audit"}} (
	id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	run_id        text        NOT NULL,
	consumer      text        NOT NULL,
	stream        text        NOT NULL,
	stream_offset bigint      NOT NULL,
	message_id    text        NOT NULL,
	business_key  text,
	payload_hash  bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
	-- What the inbox held before the repair: new, duplicate or conflict.
	inbox         text        NOT NULL,
	-- processed, or dead_lettered (the handler failed for good, or the inbox
	-- holds another payload under the id: inbox = conflict).
	outcome       text        NOT NULL,
	error         text        NOT NULL DEFAULT '',
	operator      text        NOT NULL,
	reason        text        NOT NULL,
	audited_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{.Name "replay_audit_message_idx"}} ON {{.Table "replay_audit"}} (consumer, message_id);
CREATE INDEX {{.Name "replay_audit_run_idx"}} ON {{.Table "replay_audit"}} (run_id, stream_offset);
