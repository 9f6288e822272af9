package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/cpustat"
	"github.com/idemkit/idem/migrate"
)

// bodySize is the size of every message body.
const bodySize = 256

// bench holds what every mode shares: the database, a publishing connection
// and the names to clean up.
type bench struct {
	o         options
	runID     string
	pool      *pgxpool.Pool
	tables    idem.Tables
	pub       *amqp.Connection
	queues    []string
	runs      map[string]int // runs of each mode so far, for label
	accounts  string         // quoted table name
	dedup     string         // quoted table name of the naive consumer's dedup table
	updateSQL string
	dedupSQL  string // the naive consumer's duplicate check
}

// setup creates the schema (idem's tables, accounts, the naive dedup table),
// the pool and the publishing connection.
func setup(ctx context.Context, o options) (*bench, error) {
	var id [4]byte
	_, _ = rand.Read(id[:])
	runID := hex.EncodeToString(id[:])
	schema := "bench_consumer_" + runID
	pool, err := newPool(ctx, o, "idem-bench-"+runID)
	if err != nil {
		return nil, err
	}
	b := newBench(o, runID, schema, pool)
	if _, err := migrate.Up(ctx, pool, b.tables); err != nil {
		pool.Close()
		return nil, err
	}
	ddl := `CREATE TABLE ` + b.accounts + ` (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
		INSERT INTO ` + b.accounts + ` (id) SELECT generate_series(1, ` + strconv.Itoa(o.accounts) + `);
		CREATE TABLE ` + b.dedup + ` (message_id text PRIMARY KEY)`
	if _, err := pool.Exec(ctx, ddl); err != nil {
		b.cleanup()
		return nil, fmt.Errorf("create bench tables: %w", err)
	}
	if b.pub, err = dial(o.amqpURL, "bench-publisher"); err != nil {
		b.cleanup()
		return nil, err
	}
	if b.o.prefetch == 0 {
		if b.o.prefetch, err = idemPrefetch(b.o, pool); err != nil {
			b.cleanup()
			return nil, err
		}
	}
	b.logf("run %s: schema %s, %d accounts, %d messages per mode", b.runID, schema, o.accounts, o.n)
	return b, nil
}

// idemPrefetch is the prefetch the runtime gives a default Config with the
// run's Workers and BatchMaxSize on pool: every mode then consumes with it.
func idemPrefetch(o options, pool *pgxpool.Pool) (int, error) {
	c, err := consumer.New(consumer.Config{AMQPURL: o.amqpURL, Name: "bench-defaults", Pool: pool, Queue: "bench-defaults",
		Workers: o.workers, BatchMaxSize: o.batchMaxSize})
	if err != nil {
		return 0, fmt.Errorf("idem's default prefetch: %w", err)
	}
	return c.Config().Prefetch, nil
}

// appName is the application_name of the run's connections, by which their
// PostgreSQL backends are found for CPU accounting.
func (b *bench) appName() string { return "idem-bench-" + b.runID }

// newBench names the tables of schema.
func newBench(o options, runID, schema string, pool *pgxpool.Pool) *bench {
	b := &bench{o: o, runID: runID, pool: pool, tables: idem.Tables{Schema: schema}.WithDefaults()}
	b.accounts = pgx.Identifier{schema, "accounts"}.Sanitize()
	b.dedup = pgx.Identifier{schema, "naive_dedup"}.Sanitize()
	b.updateSQL = `UPDATE ` + b.accounts + ` SET balance = balance + 1 WHERE id = $1`
	b.dedupSQL = `INSERT INTO ` + b.dedup + ` (message_id) VALUES ($1) ON CONFLICT DO NOTHING`
	return b
}

// newPool opens a pool large enough for the naive consumer's goroutines.
func newPool(ctx context.Context, o options, appName string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return nil, fmt.Errorf("postgres url: %w", err)
	}
	cfg.MaxConns = int32(max(o.naiveWorkers, o.workers, 4) + 4)
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return pool, nil
}

func dial(url, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(url, amqp.Config{Properties: props, Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("connect to rabbitmq: %w", err)
	}
	return conn, nil
}

// cleanup deletes the run's queues and schema.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(b.queues) > 0 {
		conn, err := dial(b.o.amqpURL, "bench-cleanup")
		if err == nil {
			for _, q := range b.queues {
				for _, name := range amqpnames.Queues(q, 0) {
					ch, err := conn.Channel()
					if err != nil {
						break
					}
					_, _ = ch.QueueDelete(name, false, false, false)
					_ = ch.Close()
				}
			}
			_ = conn.Close()
		} else {
			b.logf("cleanup: %v (queues %v are left)", err, b.queues)
		}
	}
	if b.pub != nil {
		_ = b.pub.Close()
	}
	if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+b.tables.QuotedSchema()+` CASCADE`); err != nil {
		b.logf("cleanup: drop schema %s: %v", b.tables.Schema, err)
	}
	b.pool.Close()
}

// label names the k-th run of mode in this process: the mode itself the
// first time, "mode-k" after, so that a mode listed twice gets its own queue,
// consumer name, message ids and profile.
func (b *bench) label(mode string) string {
	if b.runs == nil {
		b.runs = map[string]int{}
	}
	b.runs[mode]++
	if k := b.runs[mode]; k > 1 {
		return fmt.Sprintf("%s-%d", mode, k)
	}
	return mode
}

// queue names a fresh queue for mode and remembers it for cleanup.
func (b *bench) queue(mode string) string {
	q := "bench.consumer." + b.runID + "." + mode
	b.queues = append(b.queues, q)
	return q
}

// declareQuorum declares q as a durable quorum queue, as the baselines use.
func (b *bench) declareQuorum(q string) error {
	ch, err := b.pub.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	return err
}

// publish sends n persistent messages with unique ids to q, with publisher
// confirms, and waits until the broker confirmed all of them. Accounts are
// drawn from a fixed seed, so every mode sees the same sequence.
func (b *bench) publish(ctx context.Context, q string, n int) error {
	ch, err := b.pub.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	rng := mrand.New(mrand.NewPCG(1, 2))
	pending := make([]*amqp.DeferredConfirmation, 0, 1000)
	for i := range n {
		body := encode(rng.IntN(b.o.accounts)+1, int64(i), time.Now())
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-%s-%d", b.runID, q, i), DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		pending = append(pending, dc)
		if len(pending) == cap(pending) || i == n-1 {
			for _, dc := range pending {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					return fmt.Errorf("publish: confirmed=%v: %v", ok, err)
				}
			}
			pending = pending[:0]
		}
	}
	return nil
}

// encode builds a 256-byte body: account (4 bytes), sequence number (8),
// publish time in Unix nanoseconds (8), then filler.
func encode(account int, seq int64, at time.Time) []byte {
	body := make([]byte, bodySize)
	binary.BigEndian.PutUint32(body[0:], uint32(account))
	binary.BigEndian.PutUint64(body[4:], uint64(seq))
	binary.BigEndian.PutUint64(body[12:], uint64(at.UnixNano()))
	for i := 20; i < bodySize; i++ {
		body[i] = 'a' + byte(i%26)
	}
	return body
}

func accountOf(body []byte) int32 { return int32(binary.BigEndian.Uint32(body)) }

func seqOf(body []byte) int64 { return int64(binary.BigEndian.Uint64(body[4:])) }

// balanceSum is the sum of all balances: every processed message adds one.
func (b *bench) balanceSum(ctx context.Context) (int64, error) {
	var sum int64
	err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0)::bigint FROM `+b.accounts).Scan(&sum)
	return sum, err
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// machine describes where the benchmark ran.
type machine struct {
	cpus                int
	cpuModel, goVersion string
	postgres, rabbitmq  string
	pgSettings          string
	loadStart, loadEnd  string
}

func (b *bench) machine(ctx context.Context) machine {
	m := machine{cpus: runtime.NumCPU(), goVersion: runtime.Version(), loadStart: cpustat.LoadAvg()}
	_ = b.pool.QueryRow(ctx, `SHOW server_version`).Scan(&m.postgres)
	var sc, fsync, sb string
	_ = b.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync'), current_setting('shared_buffers')`).Scan(&sc, &fsync, &sb)
	m.pgSettings = fmt.Sprintf("synchronous_commit=%s, fsync=%s, shared_buffers=%s", sc, fsync, sb)
	if v, ok := b.pub.Properties["version"].(string); ok {
		m.rabbitmq = v
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpuModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	return m
}

// procStatus reads VmHWM and VmRSS (kB) from /proc/self/status.
func procStatus() (hwm, rss int64) {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss
}
