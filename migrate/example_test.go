package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrate"
)

// Up applies what is missing; running it again, from this process or
// another, applies nothing.
func ExampleUp() {
	ctx := context.Background()
	url := os.Getenv("IDEM_PG_URL")
	if url == "" {
		url = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	tables := idem.Tables{Schema: "example_migrate_" + hex.EncodeToString(suffix[:])}
	defer pool.Exec(ctx, "DROP SCHEMA "+tables.QuotedSchema()+" CASCADE")

	first, err := migrate.Up(ctx, pool, tables) // creates the schema and every table
	if err != nil {
		log.Fatal(err)
	}
	again, err := migrate.Up(ctx, pool, tables)
	if err != nil {
		log.Fatal(err)
	}
	all, err := migrate.All(tables)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first run applied every migration:", len(first.Applied) == len(all))
	fmt.Println("second run applied:", len(again.Applied))
	// Output:
	// first run applied every migration: true
	// second run applied: 0
}

// SQL is the whole schema as one script, for teams that apply migrations
// with their own tool; `idem migrate --print-sql` prints the same.
func ExampleSQL() {
	script, err := migrate.SQL(idem.Tables{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.SplitN(script, "\n", 2)[0])
	fmt.Println(strings.Contains(script, `CREATE TABLE "billing"."idem_inbox"`))
	// Output:
	// CREATE SCHEMA IF NOT EXISTS "billing";
	// true
}
