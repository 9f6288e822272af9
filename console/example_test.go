package console_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/console"
)

// The console mounted in a worker's own HTTP server, under /console/, for
// operators who sign in with basic authentication.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_PG_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	c, err := console.New(console.Config{
		Pool:      pool,
		Tables:    idem.Tables{Schema: "billing"},
		AMQPURLs:  []string{os.Getenv("IDEM_AMQP_URL")},
		Prefix:    "/console",
		BasicAuth: map[string]string{"alice": os.Getenv("CONSOLE_ALICE_PASSWORD")},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	mux := http.NewServeMux()
	mux.Handle("/console/", c)
	srv := &http.Server{Addr: "0.0.0.0:8080", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ListenAndServe() }()
	defer srv.Close()
}

// Without authentication the console answers on loopback only: check the
// address before listening, as `idem console` does.
func ExampleLoopbackAddr() {
	addr := "0.0.0.0:8080"
	if !console.LoopbackAddr(addr) {
		log.Printf("refusing to serve the console on %s without authentication", addr)
	}
}
