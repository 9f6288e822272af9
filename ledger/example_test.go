package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
)

// A handler records an e-mail in the same transaction as its business write;
// the dispatcher sends it after the commit, with a stable idempotency key.
func Example() {
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
	tables := idem.Tables{Schema: "example_ledger_" + hex.EncodeToString(suffix[:])}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+tables.QuotedSchema()+" CASCADE")

	// The mail provider.
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("provider got %s with Idempotency-Key %s\n", body, r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusAccepted)
	}))
	defer provider.Close()

	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	// Inside a handler: the business write and the effect commit together.
	var entry ledger.Entry
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ... (the business write)
		entry, err = l.Record(ctx, tx, ledger.Effect{
			Type:        "mail.order-confirmation",
			BusinessKey: "order-1042",
			Target:      provider.URL,
			Request:     map[string]string{"to": "ada@example.com"},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// Usually a long-running worker of its own.
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{
		Pool:      pool,
		Tables:    tables,
		Executors: map[string]ledger.Executor{"mail.order-confirmation": &ledger.HTTPExecutor{}},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	for entry.Status != ledger.StatusSucceeded {
		time.Sleep(10 * time.Millisecond)
		if entry, err = l.Get(ctx, entry.ID); err != nil {
			log.Fatal(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println(entry.ID, entry.Status, entry.AttemptCount)
	// Output:
	// provider got {"to":"ada@example.com"} with Idempotency-Key 192ddd89aebf2e22d1aaf5aaa06c3b71
	// 865739beecc35ced9e7b3d8da86ce4e5 succeeded 1
}
