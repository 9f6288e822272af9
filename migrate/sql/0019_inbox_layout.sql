-- The inbox's layout. Empty for the plain layout (one table, rows deleted
-- in chunks by retention); one row when the inbox is laid out in time
-- partitions (`idem migrate --partition-width`, inbox.LayOutPartitioned),
-- giving their width: partition bounds are multiples of it since the Unix
-- epoch, and retention drops whole partitions.
CREATE TABLE {{.Table "inbox_layout"}} (
	partition_width interval    NOT NULL CHECK (partition_width >= interval '1 second'),
	laid_out_at     timestamptz NOT NULL DEFAULT now(),
	one             boolean     PRIMARY KEY DEFAULT true CHECK (one)
);
