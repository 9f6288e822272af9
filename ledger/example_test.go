package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
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

// Recording is idempotent: the same effect recorded again (a redelivery, a
// replay) returns the entry already there; the same id with another request
// is a conflict, and the transaction stays usable.
func ExampleLedger_Record() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	capture := func(cents int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			e, err := l.Record(ctx, tx, ledger.Effect{
				Type:        "payment.capture",
				BusinessKey: "order-1042",
				Target:      "https://psp.example/captures",
				Request:     map[string]int{"cents": cents},
			})
			if errors.Is(err, ledger.ErrEffectConflict) {
				fmt.Println("conflict:", err)
				return nil // the transaction goes on; dead-letter the message, say
			}
			if err != nil {
				return err
			}
			fmt.Println(e.ID, e.Status)
			return nil
		})
	}
	for _, cents := range []int{1299, 1299, 1500} {
		if err := capture(cents); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// 7e772d38fdb9971779163a6fa01a08b2 pending
	// 7e772d38fdb9971779163a6fa01a08b2 pending
	// conflict: ledger: effect 7e772d38fdb9971779163a6fa01a08b2 recorded before with request dfdfd56035ac, refusing request 162a6436cdab
}

// The effect id comes from the effect's type and business key, and the
// idempotency key from the effect id: the same in every retry, redelivery,
// replay and process.
func ExampleEffectID() {
	id := ledger.EffectID("payment.capture", "order-1042")
	fmt.Println(id)
	fmt.Println(ledger.IdempotencyKey(id))
	// Output:
	// 7e772d38fdb9971779163a6fa01a08b2
	// 2b2ee03d357190737482e4f0329148e9
}

// The transactional outbox: a handler records the message to publish in its
// transaction, and the dispatcher publishes it after the commit, with the
// effect id as its message id, so that an idem consumer downstream
// deduplicates a publish that had to be repeated.
func ExampleAMQPExecutor() {
	ctx := context.Background()
	pool, tables, done := exampleDB(ctx)
	defer done()
	queue := "example.orders.confirmed." + tables.Schema
	conn, ch := exampleBroker(queue)
	defer conn.Close()

	l, err := ledger.New(ledger.Config{Pool: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business write, then the message, in the same transaction
		_, err := l.Record(ctx, tx, ledger.Effect{
			Type:        "order.confirmed",
			BusinessKey: "order-1042",
			Request: ledger.Publishing{
				RoutingKey: queue,
				Body:       []byte(`{"order":"order-1042"}`),
			},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	outbox, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: amqpURL(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer outbox.Close()
	d, err := ledger.NewDispatcher(ledger.DispatcherConfig{
		Pool:      pool,
		Tables:    tables,
		Executors: map[string]ledger.Executor{"order.confirmed": outbox},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(runCtx) }()
	msg := waitForMessage(ch, queue)
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(msg.Body), "message id = effect id:", msg.MessageId == ledger.EffectID("order.confirmed", "order-1042"))
	// Output:
	// {"order":"order-1042"} message id = effect id: true
}

func exampleDB(ctx context.Context) (*pgxpool.Pool, idem.Tables, func()) {
	return exampleenv.DB(ctx, "ledger", nil)
}

// exampleBroker connects to the broker and declares an auto-deleted queue.
func exampleBroker(queue string) (*amqp.Connection, *amqp.Channel) {
	conn, ch := exampleenv.Channel()
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		log.Fatal(err)
	}
	return conn, ch
}

// waitForMessage gets one message from queue, waiting at most 30s.
func waitForMessage(ch *amqp.Channel, queue string) amqp.Delivery {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		msg, ok, err := ch.Get(queue, true)
		if err != nil {
			log.Fatal(err)
		}
		if ok {
			return msg
		}
	}
	log.Fatal("no message in 30s")
	return amqp.Delivery{}
}

func amqpURL() string { return exampleenv.AMQPURL() }
