package pgnodes_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgnodes"
)

// A pool over a primary and its standby: each host gets its own connect
// timeout, so a host that stopped answering costs seconds.
func ExampleParseConfig() {
	cfg, err := pgnodes.ParseConfig("postgres://app:secret@pg1:5432,pg2:5432/app?target_session_attrs=read-write")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 16 // tune it as any pgxpool.Config, then pgxpool.NewWithConfig(ctx, cfg)
	fmt.Println("connect timeout per host:", cfg.ConnConfig.ConnectTimeout)
	fmt.Println("ping timeout:", cfg.PingTimeout)
	for _, h := range pgnodes.Hosts(cfg.ConnConfig) {
		fmt.Printf("host %s:%d\n", h.Host, h.Port)
	}
	// Output:
	// connect timeout per host: 3s
	// ping timeout: 2s
	// host pg1:5432
	// host pg2:5432
}

// A worker's pool from IDEM_PG_URL, tuned before it is created.
func ExampleNew() {
	ctx := context.Background()
	cfg, err := pgnodes.ParseConfig(os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err) // the error never quotes the password
	}
	cfg.MaxConns = 16 // tune it as any pgxpool.Config
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Or, untuned:
	// pool, err := pgnodes.New(ctx, os.Getenv("IDEM_PG_URL"))
}
