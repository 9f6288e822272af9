-- Dead letters: what an operator needs to answer "what happened to message X".
-- The payload itself is kept only when the consumer opts in.
CREATE TABLE {{.Table "dead_letters"}} (
	id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	consumer         text        NOT NULL,
	message_id       text        NOT NULL DEFAULT '',
	payload_hash     bytea       NOT NULL,
	stored_hash      bytea,
	reason           text        NOT NULL,
	error            text        NOT NULL DEFAULT '',
	source           text        NOT NULL DEFAULT '',
	exchange         text        NOT NULL DEFAULT '',
	routing_key      text        NOT NULL DEFAULT '',
	attempts         integer     NOT NULL DEFAULT 1,
	payload          bytea,
	dead_lettered_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{.Name "dead_letters_message_idx"}} ON {{.Table "dead_letters"}} (consumer, message_id);
CREATE INDEX {{.Name "dead_letters_at_idx"}} ON {{.Table "dead_letters"}} (dead_lettered_at);

-- Stream checkpoints, written in the same transaction as the batch they end.
CREATE TABLE {{.Table "checkpoints"}} (
	consumer    text        NOT NULL,
	stream      text        NOT NULL,
	last_offset bigint      NOT NULL,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, stream)
);
