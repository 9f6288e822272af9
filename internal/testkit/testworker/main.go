// Command testworker is the worker process the consumer's tests start (and
// kill, and restart) to check what only a separate process shows: a message
// that kills its worker, the resident memory of a worker, several worker
// processes competing for one queue. The tests build it without the race
// detector, whose instrumentation would distort the memory figure.
//
//	testworker -mode poison|memory|hot|ordered -queue Q -schema S [-expect N] [-queue-type T] [-partitions N -label L]
//
// Every mode but ordered records one row in S.effects per processed
// message. poison exits the process (code 3) on the message "poison";
// memory prints "vmhwm=BYTES" and exits once N messages are settled; hot
// also adds one to one of 20 rows of S.accounts per message. ordered
// consumes {"account":A,"seq":N} events with the account as OrderingKey
// (and -partitions partitions): it records each in S.applied with the
// process's label, and in S.violations every event that does not follow
// the last one applied for its account. IDEM_PG_URL and IDEM_AMQP_URL say
// where PostgreSQL and RabbitMQ are.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// HotAccounts is how many rows the hot mode's handler updates.
const HotAccounts = 20

// partitions and label are the ordered mode's flags.
var (
	partitions int
	label      string
)

func main() {
	mode := flag.String("mode", "", "poison, memory or hot")
	queue := flag.String("queue", "", "the queue")
	schema := flag.String("schema", "", "the schema of idem's tables, effects and accounts")
	expect := flag.Int64("expect", 0, "memory: exit after this many settled messages")
	queueType := flag.String("queue-type", "", "x-queue-type (default quorum)")
	flag.IntVar(&partitions, "partitions", 0, "ordered: Config.Partitions")
	flag.StringVar(&label, "label", "", "ordered: the name this process records its events under")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *mode, *queue, *schema, *queueType, *expect); err != nil {
		fmt.Fprintln(os.Stderr, "testworker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, mode, queue, schema, queueType string, expect int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		return err
	}
	defer pool.Close()
	tables := idem.Tables{Schema: schema}
	cfg := consumer.Config{Name: "test", Pool: pool, Queue: queue, AMQPURL: testbroker.URL(),
		Tables: tables, Logger: testrun.Logger(), Workers: 2, QueueType: queueType}
	if mode == "ordered" {
		cfg.Partitions, cfg.OrderingKey, cfg.Workers = partitions, accountOf, 4
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	if mode == "ordered" {
		c.Handle(ordered(tables))
	} else {
		c.Handle(handler(mode, tables))
	}
	if mode == "memory" {
		go func() { // owned: ends with cancel, when the messages are settled
			for settled(c) < expect && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Printf("vmhwm=%d\n", vmHWM())
			cancel()
		}()
	}
	return c.Run(ctx)
}

func handler(mode string, tables idem.Tables) consumer.Handler {
	insert := `INSERT INTO ` + tables.QuotedSchema() + `.effects (message_id) VALUES ($1)`
	hot := `UPDATE ` + tables.QuotedSchema() + `.accounts SET balance = balance + 1 WHERE id = $1`
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if mode == "poison" && m.ID == "poison" {
			os.Exit(3) // the process dies with the message unacked
		}
		if mode == "hot" {
			if _, err := tx.Exec(ctx, hot, HotAccount(m.ID)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, insert, m.ID)
		return err
	}
}

// event is a message of the ordered mode.
type event struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

func accountOf(m *consumer.Message) string {
	var e event
	_ = json.Unmarshal(m.Body, &e)
	return e.Account
}

// ordered applies an event: it must follow the last one applied for its
// account (seq = last + 1), or it is recorded as a violation; either way it
// becomes the account's last.
func ordered(tables idem.Tables) consumer.Handler {
	s := tables.QuotedSchema()
	return consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, e event) error {
		var last int
		err := tx.QueryRow(ctx, `INSERT INTO `+s+`.last_seq (account, seq) VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET seq = EXCLUDED.seq
			RETURNING COALESCE((SELECT seq FROM `+s+`.last_seq WHERE account = $1), 0)`, e.Account, e.Seq).Scan(&last)
		if err != nil {
			return err
		}
		if e.Seq != last+1 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.violations (account, seq, after) VALUES ($1, $2, $3)`, e.Account, e.Seq, last); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s+`.applied (message_id, label) VALUES ($1, $2)`, m.ID, label)
		return err
	})
}

// HotAccount is the account a message of the hot mode updates.
func HotAccount(id string) int {
	h := 0
	for _, c := range []byte(id) {
		h = h*31 + int(c)
	}
	return (h%HotAccounts + HotAccounts) % HotAccounts
}

func settled(c *consumer.Consumer) int64 {
	s := c.Stats()
	return s.Processed + s.Duplicates + s.DeadLettered
}

// vmHWM is this process's resident high-water mark in bytes.
func vmHWM() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return -1
}
