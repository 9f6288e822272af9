-- Consumer names and message ids are opaque identifiers: compare them byte
-- by byte. The database's default collation would send every comparison in
-- the primary key through the locale (strcoll), a large share of the cost
-- of a claim. Changing only the collation keeps the table as it is and
-- rebuilds the primary key index (under an exclusive lock: on a large inbox,
-- run `idem migrate` when the consumers are stopped).
ALTER TABLE {{.Table "inbox"}}
	ALTER COLUMN consumer TYPE text COLLATE "C",
	ALTER COLUMN message_id TYPE text COLLATE "C";
