package main

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/migrate"
)

func runMigrate(ctx context.Context, e *env, args []string) error {
	fs := e.flags("migrate")
	printSQL := fs.Bool("print-sql", false, "print the SQL instead of applying it (for goose, atlas, …)")
	width := fs.Duration("partition-width", 0, "lay the inbox and the dead letters out in time partitions this wide (1m to 744h), which retention drops whole; an inbox that holds rows is converted online, while workers run")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *printSQL && *width != 0 {
		return fmt.Errorf("migrate: --partition-width lays the inbox out and makes its partitions against the database; it cannot be printed")
	}
	if *printSQL {
		sql, err := migrate.SQL(e.tables)
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(e.stdout, sql)
		return err
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrate.UpWith(ctx, pool, e.tables, migrate.Options{PartitionWidth: *width})
	if err != nil {
		return err
	}
	if *width != 0 {
		e.printf("schema %s: the inbox is partitioned %v wide\n", e.tables.Schema, *width)
	}
	for _, t := range res.KeptPlain {
		e.printf("schema %s: %s holds rows and keeps the plain layout; run this again once `idem cleanup` has emptied it\n", e.tables.Schema, t)
	}
	if len(res.Applied) == 0 {
		e.printf("schema %s is up to date at version %d\n", e.tables.Schema, res.Current)
		return nil
	}
	e.printf("schema %s: applied %v, now at version %d\n", e.tables.Schema, res.Applied, res.Current)
	return nil
}
