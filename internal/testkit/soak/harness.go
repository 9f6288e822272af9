package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/amqpurl"
	"github.com/idemkit/idem/internal/streamio"
)

// harness is one soak run: its names, processes and connections.
type harness struct {
	cfg    config
	run    string // run id: names every schema, queue, stream and id
	tmp    string
	logDir string
	quiet  *slog.Logger

	bins       map[example]string
	sup        *supervisor
	workers    map[example]*proc
	extrasMu   sync.Mutex
	extras     []*proc // the compete fault's liveness processes, running or stopped
	gateway    *proc
	mail       *proc
	gatewayURL string
	mailURL    string

	db     *monitor
	pub    *publisher
	stream string
	tail   int64 // the stream's last offset once publishing ended
	// amqpPorts and streamPorts are the broker's ports, its nodes'.
	amqpPorts, streamPorts map[int]bool

	// cluster is scripts/cluster.sh's topology, with the node or
	// pgfailover fault (nil without); restoring counts the cluster faults
	// that have not put it back yet: the run has not settled before they
	// have.
	cluster   *cluster
	restoring atomic.Int32

	// floor is the retention fault's window W (retentionFloor); idem is
	// the operator's command line, built for it.
	floor time.Duration
	idem  string
	// retaining counts the retention faults still at their doors: the run
	// has not settled while one is.
	retaining atomic.Int32
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.logOut, "soak: "+format+"\n", args...)
}

func (h *harness) schema(ex example) string { return "soak_" + h.run + "_" + ex.String() }

// queue is the queue a queue example consumes; the workers declare it with
// its .retry and .dlq queues.
func (h *harness) queue(ex example) string { return "soak." + h.run + "." + ex.String() }

func (h *harness) appName(ex example) string { return "soak_" + h.run + "_" + ex.String() }

func (h *harness) appNames() []string {
	var out []string
	for _, ex := range h.cfg.examples {
		out = append(out, h.appName(ex))
	}
	return out
}

// workerList returns the examples' workers and the compete fault's extra
// liveness processes.
func (h *harness) workerList() []*proc {
	var out []*proc
	for _, ex := range h.cfg.examples {
		out = append(out, h.workers[ex])
	}
	h.extrasMu.Lock()
	defer h.extrasMu.Unlock()
	return append(out, h.extras...)
}

// queueExamples are the examples that consume a queue (not the stream).
func (h *harness) queueExamples() []example {
	return slices.DeleteFunc(slices.Clone(h.cfg.examples), func(ex example) bool { return ex == orders })
}

// soak runs the whole thing and returns its report. An error means the soak
// could not run to the end; the report, when not nil, says how far it got.
func soak(ctx context.Context, cfg config) (*report, error) {
	if cfg.seed == 0 {
		cfg.seed = mrand.Uint64()
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	h := &harness{cfg: cfg, run: hex.EncodeToString(id[:]), workers: map[example]*proc{},
		quiet: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h.stream = "soak." + h.run + ".orders"
	// The stream client logs connection teardown as errors through the
	// standard library's log package; the soak tears connections down.
	streamio.RouteClientLogs(h.quiet)
	p := newPlan(cfg, "s"+h.run)
	events, err := h.prepare(ctx, p)
	if err != nil {
		return nil, err
	}
	if h.tmp, err = os.MkdirTemp("", "idem-soak-"+h.run+"-"); err != nil {
		return nil, err
	}
	rep := &report{Run: h.run, Seed: cfg.seed, Config: reportConfig(cfg)}
	defer h.cleanup(rep)
	if err := h.build(ctx); err != nil {
		return nil, err
	}
	supCtx, stopProcs := context.WithCancel(context.WithoutCancel(ctx))
	h.sup = &supervisor{ctx: supCtx}
	defer h.sup.stop(stopProcs, 15*time.Second)
	if err := h.startAll(ctx); err != nil {
		return nil, err
	}
	if err := h.drive(ctx, p, events, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// prepare schedules the faults for plan p, reads the services' ports and
// opens the cluster the faults need.
func (h *harness) prepare(ctx context.Context, p plan) ([]event, error) {
	cfg := h.cfg
	window := p.estimate(cfg.rate)
	h.floor = retentionFloor(p, cfg.rate)
	events := schedule(cfg, window, h.floor)
	if err := checkSchedule(cfg, window, h.floor, events); err != nil {
		return nil, err
	}
	var err error
	if h.amqpPorts, err = portSet(cfg.amqpURLs, 5672); err != nil {
		return nil, fmt.Errorf("IDEM_AMQP_URL: %w", err)
	}
	if h.streamPorts, err = portSet(splitList(cfg.streamURL), streamio.DefaultStreamPort); err != nil {
		return nil, fmt.Errorf("IDEM_STREAM_URL: %w", err)
	}
	if slices.ContainsFunc(cfg.faults, isClusterFault) {
		if h.cluster, err = openCluster(ctx, cfg); err != nil {
			return nil, err
		}
	}
	h.logf("run %s, seed %d: %d messages over %s, %d faults scheduled; RabbitMQ %s, PostgreSQL %s", h.run, cfg.seed, len(p.msgs),
		window.Round(time.Second), len(events), amqpurl.RedactAll(cfg.amqpURLs), amqpurl.Redact(cfg.pgURL))
	return events, nil
}

// build makes the log directory, builds the examples (and the CLI when a
// fault needs it) into h.tmp and opens the monitor.
func (h *harness) build(ctx context.Context) error {
	h.logDir = filepath.Join(h.tmp, "logs")
	if err := os.Mkdir(h.logDir, 0o755); err != nil {
		return err
	}
	h.logf("building %s", exampleList(h.cfg.examples))
	var cli []string
	if h.cfg.has(faultRetention) {
		cli = append(cli, "./cmd/idem")
		h.idem = filepath.Join(h.tmp, "idem")
	}
	var err error
	if h.bins, err = build(ctx, h.tmp, h.cfg.examples, cli...); err != nil {
		return err
	}
	return h.openMonitor(ctx)
}

// drive publishes plan p while the injector runs events, waits until
// everything settles (within -duration-cap), and writes what it saw and
// the checks into rep.
func (h *harness) drive(ctx context.Context, p plan, events []event, rep *report) error {
	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(h.cfg.durationCap))
	defer cancel()
	h.pub = newPublisher(h, p)
	in := &injector{h: h, start: start}
	injCtx, stopInjector := context.WithCancel(runCtx)
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		in.run(injCtx, events)
	}()
	defer func() { stopInjector(); <-injected }()

	pubErr := h.pub.run(runCtx, start)
	var settleErr error
	if pubErr == nil {
		h.logf("published %d messages in %s; waiting for everything to settle", len(p.msgs), time.Since(start).Round(time.Millisecond))
		settleErr = h.settle(runCtx)
	}
	settled := time.Now()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Every watcher has seen its probe by now, unless something is stuck.
	time.Sleep(200 * time.Millisecond)
	stopInjector()
	<-injected

	rep.Injections = in.injections()
	rep.Took = settled.Sub(start)
	rep.PublishTook = h.pub.finished().Sub(start)
	if pubErr != nil {
		rep.fail("publish", "all messages published", pubErr.Error())
	}
	if settleErr != nil {
		rep.fail("settle", "everything settled within -duration-cap", settleErr.Error())
	}
	h.check(ctx, rep, p, in.faultyDeadLetters())
	for _, u := range h.sup.unexpected() {
		rep.fail("processes", "no process exited unless the soak killed or stopped it, or a poison message crashed it", u)
	}
	rep.finish(h.cfg)
	return nil
}

// checkSchedule refuses a configuration whose schedule misses a fault.
func checkSchedule(cfg config, window, floor time.Duration, events []event) error {
	if window >= cfg.durationCap {
		return fmt.Errorf("publishing takes %s at -rate %.0f, longer than -duration-cap %s", window.Round(time.Second), cfg.rate, cfg.durationCap)
	}
	for _, f := range cfg.faults {
		if f == faultGateway || slices.ContainsFunc(events, func(e event) bool { return e.fault == f }) {
			continue
		}
		if f == faultRetention {
			return fmt.Errorf("fault retention does not fit in this run: it cleans at the floor %s once rows are older than that, from %s on, "+
				"and publishing takes %s: raise -n or lower -rate", floor, floor+retentionLead, window.Round(time.Second))
		}
		return fmt.Errorf("fault %s does not fit in this run (publishing takes %s; the dispatcher and pgfailover faults need %s of lease before -duration-cap %s): raise -n or -duration-cap, or lower -rate",
			f, window.Round(time.Second), dispatcherLease, cfg.durationCap)
	}
	return nil
}

// portSet is the set of the URLs' ports, def standing for a missing one.
func portSet(urls []string, def int) (map[int]bool, error) {
	ports, err := portsOf(urls, def)
	if err != nil {
		return nil, err
	}
	set := map[int]bool{}
	for _, p := range ports {
		set[p] = true
	}
	return set, nil
}

// withAppName returns the PostgreSQL URL with application_name set.
func withAppName(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("IDEM_PG_URL: %w", err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (h *harness) openMonitor(ctx context.Context) error {
	pgURL, err := withAppName(h.cfg.pgURL, "soak_"+h.run+"_monitor")
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return fmt.Errorf("connect to postgres: %w", err)
	}
	h.db = &monitor{pool: pool, tables: map[example]idem.Tables{}}
	for _, ex := range h.cfg.examples {
		h.db.tables[ex] = idem.Tables{Schema: h.schema(ex)}.WithDefaults()
	}
	return nil
}

// queueDepth is the number of ready messages in queue, as any node of
// urls that answers tells.
func queueDepth(ctx context.Context, urls []string, queue string) (int, error) {
	conn, _, err := amqpnodes.Dial(ctx, urls, amqp.Config{})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q.Messages, err
}

// cleanup removes what the run created, unless -keep: the schemas, the
// queues and the stream; the temporary directory too, except the worker
// logs when the run failed.
func (h *harness) cleanup(rep *report) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h.cfg.keep {
		h.logf("kept schemas soak_%s_*, queues and stream soak.%s.*, logs in %s", h.run, h.run, h.logDir)
		if h.db != nil {
			h.db.pool.Close()
		}
		return
	}
	var errs []error
	if h.db != nil {
		for _, ex := range h.cfg.examples {
			if _, err := h.db.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+h.db.tables[ex].QuotedSchema()+` CASCADE`); err != nil {
				errs = append(errs, err)
			}
		}
		h.db.pool.Close()
	}
	if conn, _, err := amqpnodes.Dial(ctx, h.cfg.amqpURLs, amqp.Config{}); err == nil {
		for _, ex := range h.queueExamples() {
			for _, q := range []string{h.queue(ex), h.queue(ex) + ".retry", h.queue(ex) + ".dlq"} {
				if ch, err := conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(q, false, false, false)
					_ = ch.Close()
				}
			}
		}
		_ = conn.Close()
	} else {
		errs = append(errs, err)
	}
	if h.cfg.runs(orders) {
		if env, err := streamio.Open(ctx, streamio.Config{URI: h.cfg.streamURL, Logger: h.quiet}); err == nil {
			if err := env.DeleteStream(ctx, h.stream); err != nil && !errors.Is(err, streamio.ErrStreamNotFound) {
				errs = append(errs, err)
			}
			env.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.logf("cleanup: %v", err)
	}
	if rep != nil && !rep.Pass && rep.finished {
		h.logf("worker logs kept in %s", h.logDir)
		return
	}
	_ = os.RemoveAll(h.tmp)
}

func exampleList(exs []example) string {
	var names []string
	for _, ex := range exs {
		names = append(names, ex.String())
	}
	return strings.Join(names, ",")
}
