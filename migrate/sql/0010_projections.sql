-- Online rebuilds: a rebuild run of a declared projection builds shadow
-- copies of its tables beside the live ones and swaps them in at the end.
-- The run remembers which tables, so that it can be resumed or abandoned
-- (its shadows dropped) without the handler's code at hand.
ALTER TABLE {{.Table "replay_runs"}}
	-- The projection's name; NULL for a rebuild in place and other modes.
	ADD COLUMN projection        text,
	-- The schema and the live tables of the projection; their shadows are
	-- named <table>__idem_rebuild.
	ADD COLUMN projection_schema text,
	ADD COLUMN projection_tables text[];

-- An abandoned rebuild dropped its shadow tables and will never finish.
ALTER TABLE {{.Table "replay_runs"}} DROP CONSTRAINT {{.Name "replay_runs_status_check"}};
ALTER TABLE {{.Table "replay_runs"}} ADD CONSTRAINT {{.Name "replay_runs_status_check"}}
	CHECK (status IN ('running', 'finished', 'abandoned'));
DROP INDEX {{.QuotedSchema}}.{{.Name "replay_runs_finished_idx"}};
CREATE INDEX {{.Name "replay_runs_finished_idx"}} ON {{.Table "replay_runs"}} (finished_at)
	WHERE status IN ('finished', 'abandoned');

-- Events a projection's version guard parked because versions before them
-- were missing (projection.GapPark), until those arrive. The live
-- projection's rows are under its name; a rebuild's under
-- "<name>@rebuild", moved to the name when the rebuild swaps.
CREATE TABLE {{.Table "projection_parked"}} (
	projection text        COLLATE "C" NOT NULL,
	entity     text        COLLATE "C" NOT NULL,
	entity_key text        COLLATE "C" NOT NULL,
	version    bigint      NOT NULL,
	event      jsonb       NOT NULL,
	parked_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (projection, entity, entity_key, version)
);
