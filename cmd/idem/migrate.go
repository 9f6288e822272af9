package main

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/migrate"
)

func init() {
	register(command{name: "migrate", summary: "apply idem's schema, or print it (--print-sql)", run: runMigrate})
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	fs := e.flags("migrate")
	printSQL := fs.Bool("print-sql", false, "print the SQL instead of applying it (for goose, atlas, …)")
	if err := e.parse(fs, args); err != nil {
		return err
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
	res, err := migrate.Up(ctx, pool, e.tables)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		e.printf("schema %s is up to date at version %d\n", e.tables.Schema, res.Current)
		return nil
	}
	e.printf("schema %s: applied %v, now at version %d\n", e.tables.Schema, res.Applied, res.Current)
	return nil
}
