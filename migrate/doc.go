// Package migrate owns the schema of every table idem uses: embedded,
// versioned SQL applied inside a transaction under a PostgreSQL advisory lock
// and recorded in a migrations table, so that running it twice is a no-op and
// several processes migrating at once apply each version exactly once.
//
// # Applying the schema
//
// A worker calls Up at start, with the Tables it passes to every Config:
//
//	first, err := migrate.Up(ctx, pool, tables) // creates the schema and every table
//
// Up creates the schema if needed and applies, in version order, every
// migration not yet recorded in the migrations table, in one transaction.
// Result says which versions it applied. Concurrent callers (every replica
// of a worker starting at once) wait for each other on an advisory lock of
// the schema (LockKey, visible in pg_locks), so each version is applied once.
// The command line does the same:
//
//	idem migrate [--schema S] [--prefix P]
//
// # A partitioned inbox
//
// UpWith with Options.PartitionWidth (`idem migrate --partition-width 1h`)
// applies the same migrations, then lays an empty inbox out in time
// partitions of that width and makes the first ones, so that retention
// drops whole partitions (see package inbox, "Partitions"). An inbox that
// holds rows is converted online, while workers run
// (inbox.Inbox.ConvertPartitioned). Running it again with the same width
// does nothing; another width is refused.
//
// # Schema and prefix
//
// Every table lives in Tables.Schema and is named Tables.Prefix + its name
// (public and idem_ by default), always quoted as an identifier. Several
// applications can keep separate idem tables in one database with different
// schemas or prefixes.
//
// # Your own migration tool
//
// Teams that apply migrations with goose, atlas, Flyway or the like take the
// SQL instead of calling Up: SQL returns the whole schema as one script, each
// migration introduced by a comment and followed by the insert into the
// migrations table that Up would make, and All returns the migrations one by
// one. `idem migrate --print-sql` prints the script:
//
//	script, err := migrate.SQL(idem.Tables{Schema: "billing"})
//
// # Upgrading
//
// Migrations only move forward: a new version of idem brings new files and
// Up applies them; there are no down migrations. Read the new migrations before you upgrade a large installation.
// Version 6 makes the inbox's consumer and message_id columns compare byte
// by byte (COLLATE "C": they are opaque identifiers, and the locale's
// comparisons were a large share of a claim's cost); it rebuilds the inbox's
// primary key under an exclusive lock, so on a large inbox run it while the
// consumers are stopped. Version 15 indexes the ledger's settled effects,
// which blocks the ledger's writes while it builds: on a large ledger run
// it while the workers are stopped, or create the index CONCURRENTLY under
// its name beforehand (see the migration's SQL).
// Version 16 builds an index on http_keys, which
// holds back new Idempotency-Keys while it is built, for a time that grows
// with the keys kept.
//
// # The tables
//
// inbox, inbox_horizons and inbox_holds (package inbox), dead_letters
// (package deadletters), attempts (the consumer's engine, for a queue with
// a retry queue), ledger, ledger_audit and ledger_tombstones (package
// ledger), http_keys,
// http_keys_audit, http_operations and http_operations_audit (package
// inbox/httpinbox), checkpoints (a stream consumer's, and a replay's),
// replay_runs and replay_audit (package replay), and migrations itself.
// Package retention keeps them from growing forever.
package migrate
