-- The history tables besides the inbox that `idem migrate --partition-width`
-- lays out in time partitions (package internal/timeparts), with the width
-- of their partitions. A table not listed keeps the plain layout.
CREATE TABLE {{.Table "time_partitions"}} (
	relation text     PRIMARY KEY,
	width    interval NOT NULL
);
