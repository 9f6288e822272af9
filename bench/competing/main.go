// Command competing measures how worker processes that share one consumer
// Name scale on a contended workload: it drains the same pre-published queue
// with one worker process, then with -procs processes, in the same run,
// and reports the ratio. The workload is the one users meet when they add
// processes: a plain tx.Exec handler updating one of -accounts hot rows, and
// -dup of the messages published twice in a row (the copies race in
// different processes).
//
//	go run ./bench/competing [-n 10000] [-accounts 20] [-dup 0.3] [-procs 3] [-repeat 3]
//
// Each round runs both sizes (1, then -procs) on fresh queues, so that a
// drift of the machine hits both alike; the report gives each round and the
// median ratio. Every drain is checked: the balances grow by exactly the
// number of distinct messages. IDEM_PG_URL and IDEM_AMQP_URL say where
// PostgreSQL and RabbitMQ are.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/migrate"
)

type options struct {
	pgURL, amqpURL          string
	n, accounts, procs, rep int
	dup                     float64
	child                   string // set in a worker process: the queue to consume
	schema                  string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "competing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	o := options{pgURL: env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")}
	fs := flag.NewFlagSet("competing", flag.ContinueOnError)
	fs.IntVar(&o.n, "n", 10000, "distinct messages per drain")
	fs.IntVar(&o.accounts, "accounts", 20, "hot rows the handlers update")
	fs.Float64Var(&o.dup, "dup", 0.3, "share of messages published twice in a row")
	fs.IntVar(&o.procs, "procs", 3, "worker processes of the competing drain")
	fs.IntVar(&o.rep, "repeat", 3, "rounds")
	fs.StringVar(&o.child, "child", "", "internal: run as a worker process on this queue")
	fs.StringVar(&o.schema, "schema", "", "internal: the worker's schema")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.child != "" {
		return worker(ctx, o)
	}
	return measure(ctx, o)
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// measure runs the rounds and prints the report.
func measure(ctx context.Context, o options) error {
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	o.schema = fmt.Sprintf("bench_competing_%d", time.Now().UnixNano())
	tables := idem.Tables{Schema: o.schema}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+tables.QuotedSchema()+" CASCADE") //nolint:errcheck // best effort
	if _, err := pool.Exec(ctx, `CREATE TABLE `+tables.QuotedSchema()+`.accounts (id int PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tables.QuotedSchema()+`.accounts SELECT g, 0 FROM generate_series(0, $1 - 1) g`, o.accounts); err != nil {
		return err
	}
	fmt.Printf("%d messages (+%.0f%% adjacent duplicates) on %d hot rows, plain tx.Exec handler, default Config\n\n",
		o.n, o.dup*100, o.accounts)
	fmt.Printf("| round | 1 process msg/s | %d processes msg/s | ratio |\n|---:|---:|---:|---:|\n", o.procs)
	var ratios []float64
	for round := 1; round <= o.rep; round++ {
		one, err := drain(ctx, o, pool, 1, round)
		if err != nil {
			return err
		}
		many, err := drain(ctx, o, pool, o.procs, round)
		if err != nil {
			return err
		}
		ratios = append(ratios, many/one)
		fmt.Printf("| %d | %.0f | %.0f | %.2f× |\n", round, one, many, many/one)
	}
	slices.Sort(ratios)
	fmt.Printf("\nmedian ratio %d processes / 1 process: %.2f× (rounds %.2f–%.2f×)\n", o.procs, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	return nil
}

// drain publishes the workload to a fresh queue, starts procs worker
// processes and times them until every distinct message is in the inbox.
func drain(ctx context.Context, o options, pool *pgxpool.Pool, procs, round int) (float64, error) {
	q := fmt.Sprintf("%s.p%d.r%d", o.schema, procs, round)
	if err := publish(ctx, o, q); err != nil {
		return 0, err
	}
	defer deleteQueues(o, q)
	tables := idem.Tables{Schema: o.schema}
	before, err := balance(ctx, pool, tables)
	if err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	started := time.Now()
	var cmds []*exec.Cmd
	for range procs {
		cmd := exec.Command(self, "-child", q, "-schema", o.schema)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		cmds = append(cmds, cmd)
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	if err := waitInbox(ctx, pool, tables, q, o.n); err != nil {
		return 0, err
	}
	elapsed := time.Since(started)
	after, err := balance(ctx, pool, tables)
	if err != nil {
		return 0, err
	}
	if after-before != int64(o.n) {
		return 0, fmt.Errorf("balances grew by %d for %d distinct messages", after-before, o.n)
	}
	return float64(o.n) / elapsed.Seconds(), nil
}

// publish sends o.n messages, a share o.dup of them twice in a row, with
// publisher confirms.
func publish(ctx context.Context, o options, q string) error {
	// Declare only: the pool is never used, and Workers is set so that New
	// does not size the workers by it.
	c, err := consumer.New(consumer.Config{Name: q, Pool: &pgxpool.Pool{}, Queue: q, AMQPURL: o.amqpURL, Workers: 1,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	if err := c.Declare(ctx); err != nil {
		return err
	}
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, uint64(len(q))))
	var pending []*amqp.DeferredConfirmation
	for i := range o.n {
		p := amqp.Publishing{MessageId: fmt.Sprintf("m-%d", i), Body: []byte(fmt.Sprintf(`{"account":%d}`, rng.IntN(o.accounts))),
			DeliveryMode: amqp.Persistent}
		copies := 1
		if rng.Float64() < o.dup {
			copies = 2
		}
		for range copies {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, p)
			if err != nil {
				return err
			}
			pending = append(pending, dc)
		}
	}
	for _, dc := range pending {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish not confirmed: %v", err)
		}
	}
	return nil
}

func deleteQueues(o options, q string) {
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		for _, name := range amqpnames.Queues(q, 0) {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	}
}

func balance(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) (int64, error) {
	var sum int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0)::bigint FROM `+tables.QuotedSchema()+`.accounts`).Scan(&sum)
	return sum, err
}

// waitInbox polls until the consumer q has n inbox rows, for at most 5 minutes.
func waitInbox(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, q string, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var got int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("inbox")+` WHERE consumer = $1`, q).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d messages after 5 minutes", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// worker is one worker process: the consumer q (its queue is its name)
// with a plain tx.Exec handler on the hot rows.
func worker(ctx context.Context, o options) error {
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := idem.Tables{Schema: o.schema}
	level := slog.LevelWarn
	if os.Getenv("IDEM_BENCH_DEBUG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	c, err := consumer.New(consumer.Config{Name: o.child, Pool: pool, Queue: o.child, AMQPURL: o.amqpURL, Tables: tables,
		Logger: logger})
	if err != nil {
		return err
	}
	update := `UPDATE ` + tables.QuotedSchema() + `.accounts SET balance = balance + 1 WHERE id = $1`
	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v struct{ Account int }) error {
		_, err := tx.Exec(ctx, update, v.Account)
		return err
	}))
	return c.Run(ctx)
}
