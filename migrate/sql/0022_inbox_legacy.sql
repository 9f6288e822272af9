-- An inbox converted online from the plain layout keeps its old table as
-- one partition, below the time partitions: legacy_until is where that
-- partition ends and the first time partition begins. NULL when the inbox
-- was laid out empty, or once retention has dropped the old table.
ALTER TABLE {{.Table "inbox_layout"}} ADD COLUMN legacy_until timestamptz;
