-- Every copy of a message counts. A row remembers the last time and the
-- highest stream offset at which any copy of its message was claimed (a
-- duplicate, a conflicting payload, a replayed or redriven copy), not only
-- the first: retention keeps a row as long as its last sighting is young,
-- and the horizon it records when it deletes one covers every copy.
ALTER TABLE {{.Table "inbox"}}
	-- The last claim of a later copy; NULL until a second copy arrives.
	ADD COLUMN seen_at     timestamptz,
	-- The highest stream offset of any copy; NULL until a second copy
	-- arrives, and for queues.
	ADD COLUMN seen_offset bigint;

-- The horizon is the newest sighting among the rows retention deleted.
ALTER TABLE {{.Table "inbox_horizons"}} RENAME COLUMN forgotten_received_at TO forgotten_seen_at;

-- Scopes retention must not touch: an online rebuild's private inbox scope
-- while the rebuild may still resume, swap or be abandoned.
CREATE TABLE {{.Table "inbox_holds"}} (
	consumer text        COLLATE "C" PRIMARY KEY,
	reason   text        NOT NULL,
	held_at  timestamptz NOT NULL DEFAULT now()
);

-- Rebuilds that were running when this migration ran hold their scopes.
INSERT INTO {{.Table "inbox_holds"}} (consumer, reason)
SELECT consumer || '@rebuild:' || run_id, 'online rebuild ' || run_id
FROM {{.Table "replay_runs"}}
WHERE mode = 'rebuild' AND status = 'running' AND projection IS NOT NULL
ON CONFLICT DO NOTHING;
