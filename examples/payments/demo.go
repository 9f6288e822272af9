package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/run"
)

// demoConfig is everything a demo run needs.
type demoConfig struct {
	pool    *pgxpool.Pool
	tables  idem.Tables
	publish publishConfig
	faults  faults
	// http says what is sent to the API; http.n == 0 leaves the API out,
	// and with it edge: the bulk operations and the gateway's webhooks.
	http httpDemoConfig
	edge edgeDemoConfig
	// gatewayTimeout bounds one gateway call.
	gatewayTimeout time.Duration
	// timeout bounds the wait for everything to settle.
	timeout time.Duration
	// logger receives progress; the worker's own logs go to workerLog.
	logger, workerLog *slog.Logger
	out               io.Writer
}

// runDemo is the demo subcommand.
func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments demo", flag.ContinueOnError)
	svc := serviceFlags(fs)
	pub := publishFlags(fs)
	f := faultFlags(fs, faults{FailRate: 0.1, DropAfterChargeRate: 0.05})
	gatewayTimeout := fs.Duration("gateway-timeout", 10*time.Second, "timeout of one gateway call")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait for every message and capture to settle")
	withHTTP := fs.Bool("http", true, "also run the API and send capture requests over HTTP with Idempotency-Keys")
	hcfg := httpDemoConfig{}
	fs.IntVar(&hcfg.n, "http-n", 200, "distinct Idempotency-Keys sent to the API")
	fs.Float64Var(&hcfg.dup, "http-dup", 0.2, "fraction of keys sent three times at once (double clicks)")
	fs.Float64Var(&hcfg.retry, "http-retry", 0.2, "fraction of keys sent again after their answer (client retries)")
	ecfg := edgeDemoConfig{}
	fs.IntVar(&ecfg.bulkOps, "bulk-n", 20, "bulk operations of 5 captures sent to POST /captures:bulk, each overlapping the one before by 2")
	fs.Float64Var(&ecfg.dupRate, "webhook-dup-rate", 0.3, "fraction of the gateway's webhooks delivered twice at once, and again after their answer")
	secret := webhookSecretFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !*withHTTP {
		hcfg.n = 0
	}
	ecfg.secret = webhookSecret(*secret)
	pool, tables, err := svc.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub.amqpURL, pub.bad = svc.amqpURL, true
	return demo(ctx, demoConfig{
		pool: pool, tables: tables, publish: *pub, faults: *f, http: hcfg, edge: ecfg,
		gatewayTimeout: *gatewayTimeout, timeout: *timeout,
		logger: newLogger(slog.LevelInfo), workerLog: newLogger(slog.LevelError), out: os.Stdout,
	})
}

// demo starts a gateway on a free port and a worker, publishes capture
// requests with duplicates, producer retries and bad messages, sends capture
// requests to the API (when cfg.http.n > 0) with retried, concurrently
// duplicated and reused keys, waits until every message is settled and every
// capture is done, then prints the gateway's stats and checks that each
// capture request was charged once.
func demo(ctx context.Context, cfg demoConfig) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo: gateway listener: %w", err)
	}
	defer ln.Close()
	gatewayURL := "http://" + ln.Addr().String()
	g := newGateway(cfg.faults, cfg.workerLog)
	w, err := newWorker(workerConfig{
		pool: cfg.pool, tables: cfg.tables, amqpURL: cfg.publish.amqpURL, queue: cfg.publish.queue,
		partitions: cfg.publish.partitions, gatewayURL: gatewayURL, client: &http.Client{Timeout: cfg.gatewayTimeout}, logger: cfg.workerLog,
		tuneDispatcher: func(d *ledger.DispatcherConfig) {
			d.PollInterval = 200 * time.Millisecond
			d.RetryBackoff = 50 * time.Millisecond
			d.RetryBackoffMax = time.Second
		},
	})
	if err != nil {
		return err
	}
	if err := w.consumer.Declare(ctx); err != nil {
		return err
	}
	// Leftovers of an interrupted run would be counted as this run's.
	if err := purge(cfg.publish.amqpURL, w.consumer.Queues()); err != nil {
		return err
	}

	var rep demoReport
	apiURL := ""
	fns := []func(context.Context) error{
		func(ctx context.Context) error { return serveHTTP(ctx, "gateway", ln, g.handler()) },
		w.run,
		func(ctx context.Context) error {
			var err error
			rep, err = drive(ctx, cfg, w.consumer, gatewayURL, apiURL)
			return err
		},
	}
	if cfg.http.n > 0 {
		if len(cfg.edge.secret) == 0 {
			cfg.edge.secret = []byte(rand.Text()) // a secret of the run's own
		}
		a, err := newAPI(apiConfig{
			pool: cfg.pool, tables: cfg.tables, amqpURL: cfg.publish.amqpURL, queue: cfg.publish.queue,
			partitions: cfg.publish.partitions, wait: 5 * time.Second, logger: cfg.workerLog, webhookSecret: cfg.edge.secret,
			tuneDispatcher: func(d *ledger.DispatcherConfig) { d.PollInterval = 200 * time.Millisecond },
		})
		if err != nil {
			return err
		}
		apiLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("demo: api listener: %w", err)
		}
		defer apiLn.Close()
		apiURL = "http://" + apiLn.Addr().String()
		hooks := g.sendWebhooks(webhookConfig{url: apiURL + "/webhooks/gateway", secret: cfg.edge.secret, dupRate: cfg.edge.dupRate})
		fns = append(fns, func(ctx context.Context) error { return a.run(ctx, apiLn) }, hooks.run)
	}
	if err := run.All(ctx, fns...); err != nil {
		return err
	}
	return rep.print(cfg.out)
}

// demoReport is what a demo run observed.
type demoReport struct {
	pub       published
	http      httpReport // zero when the API was left out
	edge      edgeReport // bulk, webhooks and statuses; zero without the API
	took      time.Duration
	consumer  consumer.Stats
	gateway   gatewayStats
	rawStats  []byte
	payments  int
	effects   map[ledger.Status]int
	dead      map[string]int // dead_letters rows of the run, by reason
	dlq       int            // messages in the dead-letter queue
	dlqName   string
	deadTable string
	// eventsBefore are the gateway_events rows and distinct event ids of
	// earlier runs on the same tables, read before this one sends.
	eventsBefore [2]int
}

// drive publishes, sends the HTTP requests (when apiURL is set), waits until
// everything is settled and collects the report.
func drive(ctx context.Context, cfg demoConfig, c *consumer.Consumer, gatewayURL, apiURL string) (demoReport, error) {
	rep := demoReport{dlqName: c.Config().DeadLetterQueue, deadTable: cfg.tables.Table("dead_letters")}
	rows, distinct, err := eventRows(ctx, cfg.pool, cfg.tables)
	if err != nil {
		return rep, err
	}
	rep.eventsBefore = [2]int{rows, distinct}
	start := time.Now()
	if err := rep.send(ctx, cfg, apiURL); err != nil {
		return rep, err
	}
	if err := rep.wait(ctx, cfg, c, gatewayURL); err != nil {
		return rep, err
	}
	rep.took = time.Since(start)
	rep.consumer = c.Stats()
	return rep, rep.collect(ctx, cfg, gatewayURL, apiURL)
}

// send publishes the messages and, when apiURL is set, sends the capture
// requests, the bulk operations and the forged webhooks to the API.
func (rep *demoReport) send(ctx context.Context, cfg demoConfig, apiURL string) error {
	var err error
	if rep.pub, err = publish(ctx, cfg.publish); err != nil {
		return err
	}
	cfg.logger.Info("published", "messages", rep.pub.messages, "captures", rep.pub.captures,
		"duplicates", rep.pub.dups, "producer_retries", rep.pub.retries, "prefix", rep.pub.prefix)
	if apiURL == "" {
		return nil
	}
	if rep.http, err = sendHTTP(ctx, cfg.http, apiURL, rep.pub.prefix); err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second}
	if rep.edge, err = sendBulk(ctx, cfg.edge, client, apiURL, rep.pub.prefix); err != nil {
		return err
	}
	if rep.edge.forged, err = sendForgedWebhooks(ctx, cfg.edge, client, apiURL, rep.pub.prefix); err != nil {
		return err
	}
	cfg.logger.Info("sent over http", "requests", rep.http.requests, "keys", rep.http.keys,
		"capture_requests", len(rep.http.ids), "bulk_items", describeCounts(rep.edge.items))
	return nil
}

// apiIDs are the captureRequestIds the API accepted, single and bulk.
func (rep *demoReport) apiIDs() []string {
	return append(rep.http.captureRequestIDs(), rep.edge.captureRequestIDs()...)
}

// wait waits until every message is settled, every effect done, every
// dead letter in its queue and every webhook delivered, or cfg.timeout.
func (rep *demoReport) wait(ctx context.Context, cfg demoConfig, c *consumer.Consumer, gatewayURL string) error {
	ids := rep.apiIDs()
	messages := rep.pub.messages + len(ids)
	like := rep.pub.prefix + "-%"
	deadline := time.Now().Add(cfg.timeout)
	lastLog := time.Now()
	for {
		s := c.Stats()
		settled := s.Processed + s.Duplicates + s.DeadLettered
		// The API's outbox messages and captures have their
		// captureRequestIds as business keys.
		open, err := count(ctx, cfg.pool, `SELECT count(*) FROM `+cfg.tables.Table("ledger")+
			` WHERE (business_key LIKE $1 OR business_key = ANY($2)) AND status IN ('pending', 'in_flight', 'failed_retryable')`,
			like, ids)
		if err != nil {
			return err
		}
		_, g, err := fetchStats(ctx, gatewayURL)
		if err != nil {
			return err
		}
		if settled >= int64(messages) && open == 0 && g.Webhooks.pending() == 0 {
			// The runtime counts a dead letter before its publish to the
			// dead-letter queue is confirmed.
			if rep.dlq, err = queueDepth(cfg.publish.amqpURL, rep.dlqName); err != nil {
				return err
			}
			if rep.dlq >= total(rep.pub.deadLetters) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: not settled after %s: %d of %d messages, %d effects still open, %d webhooks pending, %d dead letters in %s",
				cfg.timeout, settled, messages, open, g.Webhooks.pending(), rep.dlq, rep.dlqName)
		}
		if time.Since(lastLog) >= time.Second {
			cfg.logger.Info("waiting", "settled", settled, "messages", messages, "open_effects", open, "webhooks_pending", g.Webhooks.pending())
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// collect reads what the checks compare, once everything settled.
func (rep *demoReport) collect(ctx context.Context, cfg demoConfig, gatewayURL, apiURL string) error {
	like := rep.pub.prefix + "-%"
	var err error
	if rep.rawStats, rep.gateway, err = fetchStats(ctx, gatewayURL); err != nil {
		return err
	}
	if rep.payments, err = count(ctx, cfg.pool, `SELECT count(*) FROM `+paymentsTable(cfg.tables)+
		` WHERE capture_request_id LIKE $1`, like); err != nil {
		return err
	}
	if rep.effects, err = groupCount[ledger.Status](ctx, cfg.pool, `SELECT status, count(*) FROM `+cfg.tables.Table("ledger")+
		` WHERE business_key LIKE $1 GROUP BY status`, like); err != nil {
		return err
	}
	rep.dead, err = groupCount[string](ctx, cfg.pool, `SELECT reason, count(*) FROM `+rep.deadTable+
		` WHERE consumer = $2 AND message_id LIKE $1 GROUP BY reason`, like, consumerName)
	if err != nil || apiURL == "" {
		return err
	}
	if err := rep.http.settle(ctx, cfg.pool, cfg.tables); err != nil {
		return err
	}
	if err := rep.edge.settle(ctx, cfg.pool, cfg.tables, apiURL, rep.apiIDs()); err != nil {
		return err
	}
	// The checks count this run's events: earlier runs left theirs.
	rep.edge.rows -= rep.eventsBefore[0]
	rep.edge.distinct -= rep.eventsBefore[1]
	return nil
}

// print writes the report and the checks; it fails if a check does.
func (r demoReport) print(out io.Writer) error {
	p, s := r.pub, r.consumer
	fmt.Fprintf(out, "\nidem payments demo\n")
	fmt.Fprintf(out, "  messages published  %6d  (%d distinct capture requests, %d re-published, %d producer retries, %d bad)\n",
		p.messages, p.captures, p.dups, p.retries, p.bad)
	fmt.Fprintf(out, "  consumer            %6d processed (business duplicates included), %d duplicates skipped, %d dead-lettered (%d conflict)\n",
		s.Processed, s.Duplicates, s.DeadLettered, s.Conflicts)
	fmt.Fprintf(out, "  capture effects     %6d  %s\n", total(r.effects), describeCounts(r.effects))
	fmt.Fprintf(out, "  dead letters        %6d  %s (%s; %d in %s)\n", total(r.dead), describeCounts(r.dead), r.deadTable, r.dlq, r.dlqName)
	h := r.http
	if h.keys > 0 {
		fmt.Fprintf(out, "  http requests       %6d  (%d Idempotency-Keys: %s)\n", h.requests, h.keys, describeCounts(h.outcomes))
		fmt.Fprintf(out, "  http captures       %6d  captureRequestIds; outbox messages: %s; payment rows %d; capture effects: %s\n",
			len(h.ids), describeCounts(h.published), h.payments, describeCounts(h.captured))
	}
	e := r.edge
	if h.keys > 0 {
		fmt.Fprintf(out, "  bulk items          %6d  (%s; %d captureRequestIds)\n", total(e.items), describeCounts(e.items), len(e.ids))
		w := r.gateway.Webhooks
		fmt.Fprintf(out, "  gateway webhooks    %6d  events, %d deliveries (%d duplicates, %d retries); gateway_events rows %d\n",
			w.Events, w.Deliveries, w.Duplicates, w.Retries, e.rows)
	}
	fmt.Fprintf(out, "  took                %6.1fs\n", r.took.Seconds())
	fmt.Fprintf(out, "  gateway /stats      %s\n\n", strings.TrimSpace(string(r.rawStats)))

	g := r.gateway
	captures := p.captures + len(h.ids) + len(e.ids)
	checks := []check{
		{g.DoubleCharges == 0, fmt.Sprintf("double_charges == 0 (got %d)", g.DoubleCharges)},
		{g.Charges == int64(captures) && g.DistinctCaptures == int64(captures),
			fmt.Sprintf("charges (%d) == distinct captureRequestIds (%d)", g.Charges, captures)},
		{r.payments == p.captures, fmt.Sprintf("one payment row per captureRequestId (%d rows, %d requests)", r.payments, p.captures)},
		{r.effects[ledger.StatusSucceeded] == p.captures && total(r.effects) == p.captures,
			fmt.Sprintf("one succeeded capture effect per captureRequestId (%d of %d)", r.effects[ledger.StatusSucceeded], p.captures)},
		{equalCounts(r.dead, p.deadLetters), fmt.Sprintf("bad messages in the dead_letters table with their reasons (want %s)", describeCounts(p.deadLetters))},
		{r.dlq == total(p.deadLetters), fmt.Sprintf("bad messages in %s (%d of %d)", r.dlqName, r.dlq, total(p.deadLetters))},
	}
	if h.keys > 0 {
		checks = append(checks, h.checks()...)
		checks = append(checks, e.checks(g, len(h.ids)+len(e.ids))...)
	}
	failed := 0
	for _, c := range checks {
		mark := "OK  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Fprintf(out, "  %s %s\n", mark, c.what)
	}
	if failed > 0 {
		fmt.Fprintf(out, "\npayments check: FAIL (%d of %d checks)\n", failed, len(checks))
		return errors.New("payments check failed")
	}
	fmt.Fprintf(out, "\npayments check: OK — every capture request charged exactly once\n")
	return nil
}

// check is one line of the demo's verdict.
type check struct {
	ok   bool
	what string
}

// fetchStats reads GET /stats from the gateway.
func fetchStats(ctx context.Context, gatewayURL string) ([]byte, gatewayStats, error) {
	var s gatewayStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, gatewayURL+"/stats", nil)
	if err != nil {
		return nil, s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, s, fmt.Errorf("gateway stats: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, s, fmt.Errorf("gateway stats: %w", err)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, s, fmt.Errorf("gateway stats: %w", err)
	}
	return raw, s, nil
}

// purge empties the queues a consumer declares (consumer.Consumer.Queues):
// its queue or partitions, their retry queues and its dead-letter queue.
func purge(amqpURL string, queues []string) error {
	return withChannel(amqpURL, func(ch *amqp.Channel) error {
		for _, q := range queues {
			if _, err := ch.QueuePurge(q, false); err != nil {
				return fmt.Errorf("purge %s: %w", q, err)
			}
		}
		return nil
	})
}

// queueDepth is the number of ready messages in queue.
func queueDepth(amqpURL, queue string) (int, error) {
	var n int
	err := withChannel(amqpURL, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n, err
}

func withChannel(amqpURL string, fn func(*amqp.Channel) error) error {
	conn, err := dialBroker(context.Background(), amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return fn(ch)
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (int, error) {
	var n int
	err := pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// groupCount runs a query returning (key, count) rows.
func groupCount[K ~string](ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (map[K]int, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	out := map[K]int{}
	var (
		k string
		n int
	)
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error {
		out[K(k)] = n
		return nil
	})
	return out, err
}

func total[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// describeCounts renders a count map as "a 1, b 2", sorted by key.
func describeCounts[K ~string](m map[K]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[K(k)])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
