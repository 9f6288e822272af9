// Command history runs a sustained claim and retention load on one inbox
// for a while and prints, per interval, what its history costs: claims per
// second, live rows, table and index bytes, WAL bytes per claim, rows and
// index entries the server read per claim (its own counters), batches that
// failed as a whole and ran again (a lock wait past the batch's
// LockTimeout), and the retention passes (how many, the longest, what they
// removed).
//
//	go run ./bench/history [-duration 30m] [-interval 1m] [-width 1m] [-retention 10m]
//	    [-cleanup-every 30s] [-workers 2] [-batch 200] [-prefill 0] [-keep]
//
// -workers consumers of one Name run consumer.Process (the pipeline of
// consumer.Run without a broker: identity, inbox claim, handler, commit)
// on batches of -batch new messages, each with a time-ordered id
// (idem.NewMessageID), as fast as they can; the handler does nothing, so
// that the inbox's own cost is what is measured. Beside them, every
// -cleanup-every, inbox.Cleanup removes what was last seen longer ago than
// -retention (the floor lowered to it): with -width > 0 the inbox is laid
// out in time partitions that wide (`idem migrate --partition-width`) and
// retention drops whole partitions; -width 0 keeps the plain layout, which
// retention deletes row by row. Run both for the same -duration to compare
// them.
//
// -prefill N loads N rows of history before the load starts, in one
// INSERT … SELECT generate_series, of the load's consumer, with time-ordered
// ids older than the load's, last seen evenly over the half retention
// window before the start, into the partitions of their times, made first,
// then vacuumed, analyzed and checkpointed.
// The claim's cost per key grows with the number of live partitions, not
// with the rows they hold: compare a run with -prefill N to one with
// -prefill 1, which makes the same partitions and leaves them empty. A
// -retention of at least twice -duration keeps every prefilled row live to
// the end.
//
// The summary compares the rate of the last five intervals to the first
// five (fewer when the run is short) and the table bytes at the end to
// those one retention window after the start, and gives the longest
// retention pass. IDEM_PG_URL says where PostgreSQL is; the schema is
// dropped at the end unless -keep.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/migrate"
)

// options are the command-line flags.
type options struct {
	pgURL        string
	duration     time.Duration
	interval     time.Duration
	width        time.Duration
	retention    time.Duration
	cleanupEvery time.Duration
	workers      int
	batch        int
	prefill      int64
	keep         bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench/history:", err)
		os.Exit(1)
	}
}

func parse(args []string) (options, error) {
	o := options{pgURL: os.Getenv("IDEM_PG_URL")}
	if o.pgURL == "" {
		o.pgURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	}
	fs := flag.NewFlagSet("bench/history", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 30*time.Minute, "how long the load runs")
	fs.DurationVar(&o.interval, "interval", time.Minute, "how often a line is printed")
	fs.DurationVar(&o.width, "width", time.Minute, "partition width (idem migrate --partition-width); 0 keeps the plain layout")
	fs.DurationVar(&o.retention, "retention", 10*time.Minute, "retention: rows last seen longer ago are removed")
	fs.DurationVar(&o.cleanupEvery, "cleanup-every", 30*time.Second, "how often a retention pass runs")
	fs.IntVar(&o.workers, "workers", 2, "consumers of one Name claiming at once")
	fs.IntVar(&o.batch, "batch", 200, "messages per batch")
	fs.Int64Var(&o.prefill, "prefill", 0, "rows of history loaded before the load starts")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema at the end")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.duration <= 0 || o.interval <= 0 || o.retention <= 0 || o.cleanupEvery <= 0 || o.workers <= 0 || o.batch <= 0 || o.width < 0 || o.prefill < 0 {
		return o, errors.New("-duration, -interval, -retention, -cleanup-every, -workers and -batch must be positive, -width and -prefill not negative")
	}
	return o, nil
}

// counts are what the load and the retention did, read and reset by the
// sampler at each interval.
type counts struct {
	claims   atomic.Int64
	failed   atomic.Int64 // batches that failed as a whole and ran again
	mu       sync.Mutex
	passes   int
	longest  time.Duration
	removed  int64
	dropped  int
	failures []error
}

func (c *counts) pass(took time.Duration, res inbox.CleanupResult, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.failures = append(c.failures, err)
		return
	}
	c.passes++
	c.longest = max(c.longest, took)
	c.removed += res.Deleted
	c.dropped += res.Partitions
}

func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	tables := idem.Tables{Schema: "bench_history_" + hex.EncodeToString(id[:])}.WithDefaults()
	cfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(o.workers + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrate.UpWith(ctx, pool, tables, migrate.Options{PartitionWidth: o.width}); err != nil {
		return err
	}
	if !o.keep {
		defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+tables.QuotedSchema()+" CASCADE") //nolint:errcheck // best effort
	}
	ib, err := inbox.New(inbox.Config{Tables: tables})
	if err != nil {
		return err
	}
	if err := prefill(ctx, pool, ib, tables, o); err != nil {
		return err
	}
	layout := "plain layout"
	if o.width > 0 {
		layout = fmt.Sprintf("partitions %v wide", o.width)
	}
	fmt.Printf("schema %s: %s, retention %v (a pass every %v), %d workers, batches of %d, for %v\n",
		tables.Schema, layout, o.retention, o.cleanupEvery, o.workers, o.batch, o.duration)

	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var c counts
	var wg sync.WaitGroup
	errs := make(chan error, o.workers+1)
	for range o.workers {
		w, err := consumer.New(consumer.Config{Name: "history", Pool: pool, Tables: tables})
		if err != nil {
			return err
		}
		w.Handle(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
		wg.Go(func() {
			if err := load(ctx, w, o.batch, &c); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Go(func() { retain(ctx, pool, ib, o, &c) })
	err = sample(ctx, pool, tables, o, &c)
	cancel()
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// prefillSQL loads $1 rows of the consumer "history" last seen evenly over
// the $2 seconds before now, with UUIDv7-shaped ids older than any new one.
const prefillSQL = `INSERT INTO %s (consumer, message_id, payload_hash, received_at)
SELECT 'history', '00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'), sha256(int8send(i)),
	now() - make_interval(secs => $2::float8 * (1 - i::float8 / $1))
FROM generate_series(1, $1::bigint) AS i`

// prefill loads o.prefill rows of history (see prefillSQL) over half the
// retention window, into the partitions of their times: their partitions
// are made first, from one row each in the default partition.
func prefill(ctx context.Context, pool *pgxpool.Pool, ib *inbox.Inbox, tables idem.Tables, o options) error {
	if o.prefill == 0 {
		return nil
	}
	start := time.Now()
	span := (o.retention / 2).Seconds()
	if o.width > 0 {
		if _, err := pool.Exec(ctx, fmt.Sprintf(prefillSQL, tables.Table("inbox")),
			int64(2*span/o.width.Seconds())+2, span); err != nil {
			return fmt.Errorf("prefill: mark the partitions: %w", err)
		}
		if _, err := ib.EnsurePartitions(ctx, pool, 0); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		if _, err := pool.Exec(ctx, "TRUNCATE "+tables.Table("inbox")); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(prefillSQL, tables.Table("inbox")), o.prefill, span); err != nil {
		return fmt.Errorf("prefill %d rows: %w", o.prefill, err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+tables.Table("inbox")); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	// A checkpoint, so that the claims do not pay for writing out the
	// prefilled pages and imaging them into the WAL (best effort: it
	// needs the pg_checkpoint role).
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Println("prefill: no checkpoint:", err)
	}
	fmt.Printf("prefilled %d rows of history over the last %v in %v\n", o.prefill, o.retention/2, time.Since(start).Round(time.Second))
	return nil
}

// load processes batches of new messages on w until ctx ends.
func load(ctx context.Context, w *consumer.Consumer, batch int, c *counts) error {
	msgs := make([]consumer.Message, batch)
	body := []byte(`{"account":"A1","amount":1}`)
	for ctx.Err() == nil {
		for i := range msgs {
			msgs[i] = consumer.Message{MessageID: idem.NewMessageID(), Body: body}
		}
		res, err := w.Process(ctx, msgs)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// Nothing of the batch committed: run it again, as a source
			// would after its redelivery (a lock wait past the batch's
			// LockTimeout, behind the DDL of a partition, ends up here).
			c.failed.Add(1)
			continue
		}
		for _, r := range res {
			if r.Outcome != idem.Processed {
				return fmt.Errorf("message %s: %v (%v)", r.Message.ID, r.Outcome, r.Err)
			}
		}
		c.claims.Add(int64(len(res)))
	}
	return nil
}

// retain runs a retention pass every o.cleanupEvery until ctx ends.
func retain(ctx context.Context, pool *pgxpool.Pool, ib *inbox.Inbox, o options, c *counts) {
	t := time.NewTicker(o.cleanupEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		res, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: o.retention, Floor: o.retention})
		if ctx.Err() != nil {
			return
		}
		c.pass(time.Since(start), res, err)
	}
}

// The inbox's size and the server's counters, over the leaf tables of the
// inbox (its partitions, or the plain table itself) and every table of the
// schema.
const (
	sizeSQL = `SELECT coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(pg_table_size(t.relid)), 0)::bigint,
	coalesce(sum(pg_indexes_size(t.relid)), 0)::bigint
FROM (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
	UNION SELECT oid FROM pg_class WHERE oid = $1::regclass AND relkind = 'r') AS t
JOIN pg_stat_user_tables AS s USING (relid)`
	readsSQL = `SELECT t.relid::bigint, t.seq_tup_read + coalesce(t.idx_tup_fetch, 0) +
	coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes AS i WHERE i.relid = t.relid), 0)::bigint
FROM pg_stat_user_tables AS t WHERE t.schemaname = $1`
	lsnSQL = `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`
)

// snapshot is what sample reads at the end of each interval.
type snapshot struct {
	at                time.Time
	claims, failed    int64
	wal               int64
	reads             map[int64]int64 // by table oid: rows and index entries read
	rows, table, idxs int64
}

func take(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, c *counts) (snapshot, error) {
	s := snapshot{at: time.Now(), claims: c.claims.Load(), failed: c.failed.Load(), reads: map[int64]int64{}}
	// Have idle backends publish their counters (a busy one publishes
	// within a second of its last transaction).
	for _, conn := range pool.AcquireAllIdle(ctx) {
		_, _ = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		conn.Release()
	}
	if err := pool.QueryRow(ctx, lsnSQL).Scan(&s.wal); err != nil {
		return s, fmt.Errorf("read the WAL position: %w", err)
	}
	if err := pool.QueryRow(ctx, sizeSQL, tables.Table("inbox")).Scan(&s.rows, &s.table, &s.idxs); err != nil {
		return s, fmt.Errorf("read the inbox's size: %w", err)
	}
	rows, err := pool.Query(ctx, "SELECT pg_stat_clear_snapshot()")
	if err == nil {
		rows.Close()
	}
	rows, err = pool.Query(ctx, readsSQL, tables.Schema)
	if err != nil {
		return s, fmt.Errorf("read the counters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var oid, n int64
		if err := rows.Scan(&oid, &n); err != nil {
			return s, err
		}
		s.reads[oid] = n
	}
	return s, rows.Err()
}

// line is one interval of the report.
type line struct {
	rate, walPer, readsPer float64
	rows, table, idxs      int64
	passes, dropped        int
	failed                 int64
	longest                time.Duration
	removed                int64
}

// sample prints a line every o.interval until ctx ends, then the summary.
func sample(ctx context.Context, pool *pgxpool.Pool, tables idem.Tables, o options, c *counts) error {
	bg := context.WithoutCancel(ctx)
	prev, err := take(bg, pool, tables, c)
	if err != nil {
		return err
	}
	start := prev.at
	fmt.Println("  time  claims/s   live rows  table MB  index MB  WAL B/claim  reads/claim  batches again  retention passes")
	var lines []line
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
		}
		now, err := take(bg, pool, tables, c)
		if err != nil {
			return err
		}
		claims := float64(now.claims - prev.claims)
		var read int64
		for oid, n := range now.reads {
			if p, ok := prev.reads[oid]; ok { // a table dropped meanwhile takes its counters with it
				read += n - p
			}
		}
		c.mu.Lock()
		l := line{rate: claims / now.at.Sub(prev.at).Seconds(), rows: now.rows, table: now.table, idxs: now.idxs,
			passes: c.passes, dropped: c.dropped, longest: c.longest, removed: c.removed, failed: now.failed - prev.failed}
		failures := c.failures
		c.passes, c.dropped, c.longest, c.removed, c.failures = 0, 0, 0, 0, nil
		c.mu.Unlock()
		if len(failures) > 0 {
			return fmt.Errorf("retention: %w", errors.Join(failures...))
		}
		if claims > 0 {
			l.walPer, l.readsPer = float64(now.wal-prev.wal)/claims, float64(read)/claims
		}
		lines = append(lines, l)
		fmt.Printf("%6s  %8.0f  %10d  %8.1f  %8.1f  %11.0f  %11.2f  %13d  %d, longest %v, removed %d rows (%d partitions)\n",
			now.at.Sub(start).Round(time.Second), l.rate, l.rows, mb(l.table), mb(l.idxs), l.walPer, l.readsPer, l.failed,
			l.passes, l.longest.Round(time.Millisecond), l.removed, l.dropped)
		prev = now
	}
	summarise(lines, o)
	return nil
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// summarise prints the rate of the last intervals against the first, the
// table bytes at the end against one retention window in, and the longest
// retention pass.
func summarise(lines []line, o options) {
	if len(lines) < 2 {
		return
	}
	k := min(5, len(lines)/2)
	mean := func(ls []line) float64 {
		var s float64
		for _, l := range ls {
			s += l.rate
		}
		return s / float64(len(ls))
	}
	first, last := mean(lines[:k]), mean(lines[len(lines)-k:])
	var longest time.Duration
	for _, l := range lines {
		longest = max(longest, l.longest)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rate: last %d intervals %.0f claims/s, first %d %.0f: %.2fx", k, last, k, first, last/first)
	if w := int((o.retention + o.interval - 1) / o.interval); w < len(lines)-1 {
		at, end := lines[w], lines[len(lines)-1]
		fmt.Fprintf(&b, "; table bytes at the end %.2fx those one retention window in (%.1f MB, %.1f MB)",
			float64(end.table+end.idxs)/float64(at.table+at.idxs), mb(end.table+end.idxs), mb(at.table+at.idxs))
	}
	fmt.Fprintf(&b, "; longest retention pass %v", longest.Round(time.Millisecond))
	fmt.Println(b.String())
}
