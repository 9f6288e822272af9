package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/partitions"
)

// demo runs a worker in this process, publishes deposits with duplicates and
// three bad messages, waits until everything is settled and checks that every
// balance grew by exactly the sum of its distinct deposits.
func demo(ctx context.Context, o options, logger *slog.Logger) error {
	pool, tables, err := setup(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	c, err := newConsumer(o, pool, tables, quiet)
	if err != nil {
		return err
	}
	if err := c.Declare(ctx); err != nil {
		return err
	}
	// Leftovers of an interrupted run would change the balances under the
	// check: the demo starts from an empty queue.
	if n, err := purge(ctx, o); err != nil {
		return err
	} else if n > 0 {
		logger.Info("purged leftover messages", "queue", o.queue, "messages", n)
	}
	before, err := readTotals(ctx, pool, tables)
	if err != nil {
		return err
	}

	runCtx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { stopWorker(); <-done }()
	stopLog := logEverySecond(runCtx, c, logger)
	defer stopLog()

	start := time.Now()
	pub, err := publish(ctx, o, logger)
	if err != nil {
		return err
	}
	sent, bad, err := publishBad(ctx, o)
	if err != nil {
		return err
	}
	total := int64(pub.messages + sent)
	if err := awaitSettled(ctx, c, total); err != nil {
		return err
	}
	took := time.Since(start)
	after, err := readTotals(ctx, pool, tables)
	if err != nil {
		return err
	}
	r := demoRun{o: o, tables: tables, stats: c.Stats(), pub: pub, total: total, sent: sent, bad: bad, took: took}
	return r.report(before, after)
}

// totals is what the demo's check compares before and after its run.
type totals struct {
	balances map[string]int64
	dead     int64 // the quickstart consumer's dead-letter rows
}

// readTotals reads every balance and the number of dead-letter rows.
func readTotals(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) (totals, error) {
	b, err := balances(ctx, pool, tables)
	if err != nil {
		return totals{}, err
	}
	dead, err := count(ctx, pool, `SELECT count(*) FROM `+tables.Table("dead_letters")+` WHERE consumer = 'quickstart'`)
	if err != nil {
		return totals{}, err
	}
	return totals{balances: b, dead: dead}, nil
}

// awaitSettled waits, at most 2 minutes, until c has settled total messages.
func awaitSettled(ctx context.Context, c *consumer.Consumer, total int64) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s := c.Stats()
		if s.Processed+s.Duplicates+s.DeadLettered >= total {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d messages settled after 2 minutes", s.Processed+s.Duplicates+s.DeadLettered, total)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// demoRun is what one run of the demo published and counted.
type demoRun struct {
	o         options
	tables    idem.Tables
	stats     consumer.Stats
	pub       published
	total     int64
	sent, bad int
	took      time.Duration
}

// report prints the run's figures and checks that every balance grew by
// exactly its distinct deposits and that the bad messages, and only they,
// were dead-lettered.
func (r demoRun) report(before, after totals) error {
	s, dead := r.stats, after.dead-before.dead
	fmt.Printf("\nidem quickstart demo\n")
	fmt.Printf("  messages published   %6d  (%d deposits, %d re-published, %d bad)\n", r.total, r.o.n, r.pub.messages-r.o.n, r.sent)
	fmt.Printf("  processed            %6d\n", s.Processed)
	fmt.Printf("  duplicates skipped   %6d\n", s.Duplicates)
	fmt.Printf("  dead-lettered        %6d  (%d conflict; rows in %s: %d)\n", s.DeadLettered, s.Conflicts,
		r.tables.Table("dead_letters"), dead)
	fmt.Printf("  batches              %6d  (%.1f messages per commit)\n", s.Batches, float64(s.Processed+s.Duplicates+s.DeadLettered)/float64(max(s.Batches, 1)))
	fmt.Printf("  throughput           %6.0f msg/s\n", float64(r.total)/r.took.Seconds())

	accounts := make([]string, 0, len(r.pub.expected))
	for a := range r.pub.expected {
		accounts = append(accounts, a)
	}
	sort.Strings(accounts)
	wrong := 0
	for _, a := range accounts {
		if got := after.balances[a] - before.balances[a]; got != r.pub.expected[a] {
			wrong++
			fmt.Printf("  MISMATCH %s: balance grew by %d, deposits sum to %d\n", a, got, r.pub.expected[a])
		}
	}
	if wrong > 0 || s.DeadLettered != int64(r.bad) || dead != int64(r.bad) {
		fmt.Println("\nbalances check: FAIL")
		return errors.New("balances check failed")
	}
	fmt.Printf("\nbalances check: OK — %d accounts, each grew by exactly its distinct deposits; %d bad messages in %s\n",
		len(accounts), r.bad, deadletters.QueueName(r.o.queue))
	return nil
}

// publishBad sends one undecodable body, one reuse of an id with another
// payload (after its first copy), and one message without an id: sent
// messages, of which bad must be dead-lettered.
func publishBad(ctx context.Context, o options) (sent, bad int, err error) {
	conn, _, err := amqpnodes.Dial(ctx, o.amqpURLs, amqp.Config{})
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, 0, err
	}
	id := fmt.Sprintf("bad-%d", time.Now().UnixNano())
	msgs := []amqp.Publishing{
		{MessageId: id + "-malformed", Body: []byte(`{"account": "A1", "amount": `)},
		{MessageId: id + "-conflict", Body: []byte(`{"account":"A1","amount":0}`)},
		{MessageId: id + "-conflict", Body: []byte(`{"account":"A1","amount":0,"note":"same id, other payload"}`)},
		{Body: []byte(`{"account":"A1","amount":7}`)},
	}
	for i, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		dc, err := partitions.Publish(ctx, ch, o.queue, o.partitions, "A1", m)
		if err != nil {
			return 0, 0, err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return 0, 0, fmt.Errorf("publish bad message %d: confirmed=%v: %v", i, ok, err)
		}
	}
	// Whichever conflict copy is claimed first is processed (both add 0); the
	// other is the conflict.
	return len(msgs), len(msgs) - 1, nil
}

func purge(ctx context.Context, o options) (int, error) {
	conn, _, err := amqpnodes.Dial(ctx, o.amqpURLs, amqp.Config{})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if o.partitions == 0 {
		return ch.QueuePurge(o.queue, false)
	}
	total := 0
	for i := range o.partitions {
		n, err := ch.QueuePurge(partitions.QueueName(o.queue, i), false)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func balances(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT account, balance FROM `+balancesTable(tables))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var a string
	var b int64
	_, err = pgx.ForEachRow(rows, []any{&a, &b}, func() error {
		out[a] = b
		return nil
	})
	return out, err
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, sql).Scan(&n)
	return n, err
}
