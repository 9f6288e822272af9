-- Dead-letter redrive: a dead letter moved back to its queue says when, and
-- by whom when that is known.
ALTER TABLE {{.Table "dead_letters"}}
	ADD COLUMN redriven_at timestamptz,
	ADD COLUMN redriven_by text;

-- What inbox retention made a consumer forget, per source: the highest
-- stream offset and the newest receipt among the rows it deleted. A normal
-- replay that starts at or below that offset would run the handler again on
-- messages it already applied, so it refuses (see replay.Options).
CREATE TABLE {{.Table "inbox_horizons"}} (
	consumer              text        COLLATE "C" NOT NULL,
	source                text        NOT NULL,
	forgotten_offset      bigint,
	forgotten_received_at timestamptz NOT NULL,
	updated_at            timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, source)
);

-- Retention walks settled effects and finished replay runs by age.
CREATE INDEX {{.Name "ledger_settled_idx"}} ON {{.Table "ledger"}} ((coalesce(completed_at, created_at)))
	WHERE status IN ('succeeded', 'failed_terminal', 'suppressed');
CREATE INDEX {{.Name "replay_runs_finished_idx"}} ON {{.Table "replay_runs"}} (finished_at)
	WHERE status = 'finished';
