package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/consumer"
)

// modeTimeout bounds waiting for a consumer.
const modeTimeout = 5 * time.Minute

// modeResult is one throughput measurement.
type modeResult struct {
	mode    string
	round   int // 1 to -repeat
	n       int
	elapsed time.Duration
	capped  bool // stopped by -cap before all o.n messages were done
	cpu     cpuUse
	idem    *idemStats // idem modes only
}

func (r modeResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// coreMicros is the CPU the bench, PostgreSQL and RabbitMQ spent per
// message, in core-microseconds.
func (r modeResult) coreMicros() float64 {
	u := r.cpu
	return (u.self + u.postgres + u.rabbitmq).Seconds() * 1e6 / float64(max(r.n, 1))
}

// idemStats is what the runtime's metrics say about a run.
type idemStats struct {
	batches       int64   // committed batch transactions (Stats)
	retries       int64   // batch retries, all causes
	contention    int64   // batch retries after a deadlock or serialization failure
	postponed     int64   // messages that left a batch for a later one (another batch wrote their row)
	commits       int64   // COMMITs sent, failed ones included
	commitSeconds float64 // time spent in COMMIT, summed over commits
}

// throughput publishes o.n messages to a fresh queue, then times consuming
// them in mode until all are done or o.cap has passed, and checks that every
// message recorded as processed was applied exactly once.
func (b *bench) throughput(ctx context.Context, mode string) (modeResult, error) {
	res := modeResult{mode: mode}
	label := b.label(mode)
	q := b.queue(label)
	name := "bench-" + label
	var c *consumer.Consumer
	var reader *sdkmetric.ManualReader
	if mode == "raw" || mode == "naive" {
		if err := b.declareQuorum(q); err != nil {
			return res, err
		}
	} else {
		var err error
		if c, reader, err = b.newIdem(q, name, mode != "idem", mode == "idem-deferred", b.pool); err != nil {
			return res, err
		}
		if err := c.Declare(ctx); err != nil {
			return res, err
		}
	}
	before, err := b.balanceSum(ctx)
	if err != nil {
		return res, err
	}
	if err := b.publish(ctx, q, b.o.n); err != nil {
		return res, err
	}

	stopProfile, err := b.profile(label)
	if err != nil {
		return res, err
	}
	capped, cancel := context.WithTimeout(ctx, b.o.cap)
	defer cancel()
	snap := b.takeCPU(ctx)
	begin := time.Now()
	shutdown := func() {}
	switch mode {
	case "raw":
		res.n, err = b.consumeRaw(capped, q)
	case "naive":
		res.n, err = b.consumeNaive(capped, ctx, q)
	default:
		// Shut down after the clock stops: a capped run may wait for
		// batches that are retrying deadlocks.
		r := start(context.WithoutCancel(ctx), c)
		shutdown = r.close
		err = r.wait(capped, b.o.n, modeTimeout)
		res.n = int(c.Stats().Processed)
	}
	res.elapsed = time.Since(begin)
	res.cpu = cpuBetween(snap, b.takeCPU(ctx), res.elapsed, runtime.NumCPU())
	stopProfile()
	shutdown()
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		res.capped, err = true, nil
	}
	if err != nil {
		return res, err
	}
	if mode == "raw" {
		return res, nil
	}

	// Every message recorded as processed (a dedup or inbox row) must have
	// added exactly one to the balances.
	var recorded int64
	if mode == "naive" {
		err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.dedup+` WHERE starts_with(message_id, $1)`,
			b.runID+"-"+q+"-").Scan(&recorded)
	} else {
		err = b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.tables.Table("inbox")+` WHERE consumer = $1`,
			name).Scan(&recorded)
	}
	if err != nil {
		return res, err
	}
	after, err := b.balanceSum(ctx)
	if err != nil {
		return res, err
	}
	if after-before != recorded || (!res.capped && recorded != int64(b.o.n)) {
		return res, fmt.Errorf("balances grew by %d, %d messages recorded as processed, %d published",
			after-before, recorded, b.o.n)
	}
	if c != nil {
		s, err := idemMetrics(ctx, reader)
		if err != nil {
			return res, err
		}
		s.batches = c.Stats().Batches
		res.idem = &s
	}
	return res, nil
}

// profile starts a CPU profile of one mode's consume phase when asked to.
func (b *bench) profile(label string) (stop func(), err error) {
	if b.o.cpuprofile == "" {
		return func() {}, nil
	}
	f, err := os.Create(fmt.Sprintf("%s-%s.pprof", b.o.cpuprofile, label))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// consumeRaw acks every message by hand, one at a time, without a database,
// and returns how many it acked before ctx ended.
func (b *bench) consumeRaw(ctx context.Context, q string) (int, error) {
	conn, deliveries, err := b.consume(q, "bench-raw")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var sink int32
	for n := 0; n < b.o.n; n++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return n, errors.New("delivery channel closed")
			}
			sink += accountOf(d.Body)
			if err := d.Ack(false); err != nil {
				return n, fmt.Errorf("ack: %w", err)
			}
		case <-ctx.Done():
			return n, fmt.Errorf("raw consumer: %d of %d acked: %w", n, b.o.n, ctx.Err())
		}
	}
	_ = sink
	return b.o.n, nil
}

// consumeNaive is the obvious hand-written idempotent consumer: goroutines
// share one consumer channel; each message gets its own transaction
// (BEGIN; INSERT dedup ON CONFLICT DO NOTHING; UPDATE; COMMIT) and is acked
// after the commit. It returns how many messages committed before ctx ended;
// transactions use dbCtx, so the ones in flight then still finish.
func (b *bench) consumeNaive(ctx, dbCtx context.Context, q string) (int, error) {
	conn, deliveries, err := b.consume(q, "bench-naive")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var done atomic.Int64
	finished := make(chan struct{})
	failed := make(chan error, b.o.naiveWorkers)
	var wg sync.WaitGroup
	for range b.o.naiveWorkers {
		wg.Go(func() {
			for d := range deliveries {
				if err := b.naiveTx(dbCtx, &d); err != nil {
					_ = d.Nack(false, true)
					failed <- err
					return
				}
				if err := d.Ack(false); err != nil {
					failed <- err
					return
				}
				if done.Add(1) == int64(b.o.n) {
					close(finished)
				}
			}
		})
	}
	select {
	case <-finished:
	case err = <-failed:
	case <-ctx.Done():
		err = fmt.Errorf("naive consumer: %d of %d committed: %w", done.Load(), b.o.n, ctx.Err())
	}
	n := int(done.Load())
	_ = conn.Close() // closes deliveries: the goroutines end
	wg.Wait()
	return n, err
}

// naiveTx is the naive consumer's transaction for d: BEGIN; INSERT dedup
// ON CONFLICT DO NOTHING; UPDATE unless a duplicate; COMMIT.
func (b *bench) naiveTx(ctx context.Context, d *amqp.Delivery) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, b.dedupSQL, d.MessageId)
		if err != nil || tag.RowsAffected() == 0 {
			return err // a duplicate: its effect committed already
		}
		_, err = tx.Exec(ctx, b.updateSQL, accountOf(d.Body))
		return err
	})
}

// consume opens a connection and a channel with the benchmark's prefetch and
// starts consuming q with manual acks.
func (b *bench) consume(q, name string) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := dial(b.o.amqpURL, name)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(b.o.prefetch, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("consume %s: %w", q, err)
	}
	return conn, deliveries, nil
}

// newIdem builds an idem consumer whose handler runs the benchmark's UPDATE,
// with an in-process metrics reader.
func (b *bench) newIdem(q, name string, ordered, deferred bool, pool *pgxpool.Pool) (*consumer.Consumer, *sdkmetric.ManualReader, error) {
	reader := sdkmetric.NewManualReader()
	cfg := consumer.Config{
		AMQPURL:       b.o.amqpURL,
		Name:          name,
		Pool:          pool,
		Queue:         q,
		Tables:        b.tables,
		Prefetch:      b.o.prefetch,
		Workers:       b.o.workers,
		BatchMaxSize:  b.o.batchMaxSize,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		// A capped run stops while batches may still be retrying deadlocks.
		ShutdownTimeout: 10 * time.Second,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
	if ordered {
		cfg.OrderingKey = func(m *consumer.Message) string { return strconv.Itoa(int(accountOf(m.Body))) }
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	update := b.updateSQL
	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if deferred {
			return consumer.Defer(ctx, tx, update, accountOf(m.Body))
		}
		_, err := tx.Exec(ctx, update, accountOf(m.Body))
		return err
	})
	return c, reader, nil
}

// consumeIdem runs c until it has processed n messages (committed; the acks
// follow immediately) or ctx ends, then shuts it down and returns how many
// it had processed by then. Batches in flight still commit during shutdown.
func consumeIdem(ctx context.Context, c *consumer.Consumer, n int) (int, error) {
	r := start(context.WithoutCancel(ctx), c)
	defer r.close()
	err := r.wait(ctx, n, modeTimeout)
	return int(c.Stats().Processed), err
}

// running is a consumer's Run in a goroutine.
type running struct {
	c      *consumer.Consumer
	stop   context.CancelFunc
	done   chan error
	exited bool
}

func start(ctx context.Context, c *consumer.Consumer) *running {
	ctx, stop := context.WithCancel(ctx)
	r := &running{c: c, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	return r
}

// wait polls the consumer's counters every millisecond until it processed n
// messages in all, for at most limit.
func (r *running) wait(ctx context.Context, n int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for r.c.Stats().Processed < int64(n) {
		select {
		case err := <-r.done:
			r.exited = true
			return fmt.Errorf("consumer stopped after %d of %d messages: %v", r.c.Stats().Processed, n, err)
		case <-ctx.Done():
			return fmt.Errorf("%d of %d committed: %w", r.c.Stats().Processed, n, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// close stops the consumer and waits until Run returned.
func (r *running) close() {
	r.stop()
	if !r.exited {
		<-r.done
	}
}

// idemMetrics reads the runtime's OpenTelemetry metrics.
func idemMetrics(ctx context.Context, reader *sdkmetric.ManualReader) (idemStats, error) {
	var s idemStats
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return s, fmt.Errorf("collect metrics: %w", err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "idem.consumer.messages" {
					for _, dp := range data.DataPoints {
						if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == "postponed" {
							s.postponed += dp.Value
						}
					}
				}
				if m.Name != "idem.consumer.batch.retries" {
					continue
				}
				for _, dp := range data.DataPoints {
					s.retries += dp.Value
					if v, ok := dp.Attributes.Value("contention"); ok && v.AsBool() {
						s.contention += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					switch m.Name {
					case "idem.consumer.commit.duration":
						s.commitSeconds += dp.Sum
						s.commits += int64(dp.Count)
					}
				}
			}
		}
	}
	return s, nil
}
