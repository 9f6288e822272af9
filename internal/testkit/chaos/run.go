package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/projection"
)

// env is where a schedule runs: the services, and how to start a worker.
type env struct {
	// pgURL is PostgreSQL (in cluster mode it lists both nodes, with
	// target_session_attrs=read-write); amqpURL RabbitMQ, the nodes'
	// URLs separated by commas in cluster mode; streamURL the stream
	// protocol (empty: from the environment, see streamio.URLFromEnv).
	pgURL, amqpURL, streamURL string
	// cluster is scripts/cluster.sh's topology in cluster mode, else nil.
	cluster *topology
	// worker starts a worker process with args; the chaos command runs
	// itself (`chaos worker`), its test runs the test binary.
	worker func(args []string) *exec.Cmd
	logOut io.Writer
	keep   bool // keep schema, queues and logs
}

// runner runs one schedule against fresh schema, queues, proxies, gateway
// and worker processes.
type runner struct {
	env
	id, schema     string
	tables         idem.Tables
	queue, ordered string
	stream         string
	partQueue      string
	proj           *projection.Projection
	led            *ledger.Ledger
	rebuilds       int    // rebuild runs started, for their run ids
	pgOut          bool   // a PostgreSQL outage is open
	dir            string // worker logs
	pool           *pgxpool.Pool
	pgProxies      proxies // one per PostgreSQL node
	amqpProxies    proxies // one per RabbitMQ node
	proxyTB        *proxyTB
	gw             *gateway
	edge           *edge
	pub            *publisher
	procs          [workers + 3]*proc // the workers, the dispatcher, the edge, the joiner
	healthAddr     string
	model          *model
	deadSeen       map[int64]deadRow // every dead-letter row seen, by its id
	obs            observations
}

// observations are what the runner saw while the schedule ran.
type observations struct {
	mu           sync.Mutex
	outages      int      // PostgreSQL outages opened
	outagesSeen  int      // of which readiness reported
	exits        []string // worker exits nobody asked for
	settled      bool
	settleReason string
	resolved     int
	checks       []check        // checks made while the schedule ran
	doors        map[string]int // what replays, rebuilds and other doors did, by outcome
}

// check is one check of an invariant made while the schedule ran.
type check struct {
	inv string
	ok  bool
	why string
}

func (o *observations) note(f func(o *observations)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(o)
}

// runSchedule runs actions and checks the result; the report says what
// was done and what held.
func runSchedule(ctx context.Context, e env, seed uint64, actions []Action) (*report, error) {
	r, err := newRunner(ctx, e)
	if err != nil {
		return nil, err
	}
	defer r.close()
	for i, a := range actions {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := r.do(ctx, a); err != nil {
			return nil, fmt.Errorf("chaos: action %d (%s): %w", i, a, err)
		}
	}
	if err := r.heal(ctx); err != nil {
		return nil, fmt.Errorf("chaos: ending the faults: %w", err)
	}
	r.settle(ctx)
	rep := newReport(seed, actions)
	r.obs.note(func(o *observations) { rep.Doors = maps.Clone(o.doors) })
	r.check(ctx, rep)
	return rep, nil
}

func newRunner(ctx context.Context, e env) (*runner, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	r := &runner{env: e, id: id, schema: "chaos_" + id, queue: "chaos." + id, ordered: "chaos." + id + ".ordered",
		stream: "chaos." + id + ".stream", partQueue: "chaos." + id + ".part", model: newModel(), proxyTB: &proxyTB{}, deadSeen: map[int64]deadRow{}}
	r.obs.doors = map[string]int{}
	r.tables = idem.Tables{Schema: r.schema}
	var err error
	if r.dir, err = os.MkdirTemp("", "idem-chaos-"+id+"-"); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if err := r.setup(ctx); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *runner) setup(ctx context.Context) error {
	var err error
	if r.pool, err = pgxpool.New(ctx, r.pgURL); err != nil {
		return fmt.Errorf("chaos: connecting to PostgreSQL: %w", err)
	}
	if _, err := migrate.Up(ctx, r.pool, r.tables); err != nil {
		return fmt.Errorf("chaos: migrating %s: %w", r.schema, err)
	}
	if _, err := r.pool.Exec(ctx, chaosTables(r.tables.QuotedSchema())); err != nil {
		return fmt.Errorf("chaos: creating the chaos tables: %w", err)
	}
	if r.proj, err = newProjection(r.schema); err != nil {
		return err
	}
	if r.led, err = ledger.New(ledger.Config{Pool: r.pool, Tables: r.tables}); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if r.gw, err = startGateway(); err != nil {
		return err
	}
	if err := r.startProxies(); err != nil {
		return err
	}
	if err := r.declare(ctx); err != nil {
		return err
	}
	if r.pub, err = newPublisher(ctx, amqpList(r.amqpURL)); err != nil {
		return err
	}
	if r.healthAddr, err = freeAddr(); err != nil {
		return err
	}
	edgeAddr, err := freeAddr()
	if err != nil {
		return err
	}
	r.edge = newEdge(edgeAddr)
	for i := range r.procs {
		name := fmt.Sprintf("worker%d", i)
		switch i {
		case dispatcherProc:
			name = "dispatcher"
		case edgeProc:
			name = "edge"
		case joinerProc:
			name = "joiner"
		}
		args := r.workerArgs(i)
		if i != edgeProc {
			args = append(args, "-name", name)
		}
		r.procs[i] = &proc{name: name, args: args, start: r.worker, dir: r.dir, obs: &r.obs}
		if i == joinerProc {
			r.procs[i].left = true // it joins later
			continue
		}
		if err := r.procs[i].run(); err != nil {
			return err
		}
	}
	if err := r.edge.waitUp(ctx); err != nil {
		return err
	}
	return r.waitReady(ctx)
}

// declare declares the queues the workers consume, with their own
// configuration, before anything is published.
func (r *runner) declare(ctx context.Context) error {
	f := r.flags(r.amqpURL, r.pgURL)
	for _, cfg := range []consumer.Config{mainConfig(r.pool, f), orderedConfig(r.pool, f), streamConfig(r.pool, f), partConfig(r.pool, f)} {
		c, err := consumer.New(cfg)
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = c.Declare(dctx)
		cancel()
		if err != nil {
			return fmt.Errorf("chaos: declaring %s%s: %w", cfg.Queue, cfg.Stream, err)
		}
	}
	return nil
}

// startProxies puts a fault proxy in front of each RabbitMQ node and each
// PostgreSQL host (one of each on a single box).
func (r *runner) startProxies() error {
	for _, node := range amqpList(r.amqpURL) {
		host, err := hostPort(node, "5672")
		if err != nil {
			return err
		}
		r.amqpProxies = append(r.amqpProxies, faultproxy.New(r.proxyTB, host))
	}
	hosts, err := pgHostPorts(r.pgURL)
	if err != nil {
		return err
	}
	for _, host := range hosts {
		r.pgProxies = append(r.pgProxies, faultproxy.New(r.proxyTB, host))
	}
	return r.proxyTB.err()
}

// proxiedURLs are the URLs the worker processes get: every node through
// its proxy.
func (r *runner) proxiedURLs() (amqpURL, pgURL string) {
	nodes := amqpList(r.amqpURL)
	for i := range nodes {
		nodes[i] = swapHost(nodes[i], r.amqpProxies[i].Addr())
	}
	return strings.Join(nodes, ","), swapHost(r.pgURL, strings.Join(r.pgProxies.addrs(), ","))
}

// proxies are fault proxies acting as one: a fault hits every node.
type proxies []*faultproxy.Proxy

func (ps proxies) Sever() {
	for _, p := range ps {
		p.Sever()
	}
}

func (ps proxies) Refuse() {
	for _, p := range ps {
		p.Refuse()
	}
}

func (ps proxies) Stall() {
	for _, p := range ps {
		p.Stall()
	}
}

func (ps proxies) Resume() {
	for _, p := range ps {
		p.Resume()
	}
}

func (ps proxies) addrs() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

// amqpList splits a comma-separated list of AMQP URLs (one URL on a
// single box).
func amqpList(s string) []string { return splitList(s) }

// pgHostPorts are the host:port of each host a PostgreSQL URL lists
// (postgres://h1:5432,h2:5433/db).
func pgHostPorts(raw string) ([]string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, errors.New("chaos: the PostgreSQL URL is not a postgres:// URL with a host")
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "5432")
		}
		out = append(out, h)
	}
	return out, nil
}

func (r *runner) flags(amqpURL, pgURL string) workerFlags {
	streamURL := r.streamURL
	if streamURL == "" {
		streamURL = streamio.URLFromEnv()
	}
	return workerFlags{schema: r.schema, queue: r.queue, orderedQueue: r.ordered, stream: r.stream, streamURL: streamURL, partQueue: r.partQueue,
		pgURL: pgURL, amqpURL: amqpURL, gatewayURL: r.gw.URL()}
}

// workerArgs are process i's arguments: through the proxies; worker 0
// also consumes the ordered queue and the stream and serves readiness;
// then come the dispatcher and the edge.
func (r *runner) workerArgs(i int) []string {
	f := r.flags(r.proxiedURLs())
	switch i {
	case edgeProc:
		return []string{"edge", "-schema", f.schema, "-pg-url", f.pgURL, "-addr", r.edge.addr}
	case joinerProc:
		return []string{"worker", "-schema", f.schema, "-part-queue", f.partQueue, "-pg-url", f.pgURL, "-amqp-url", f.amqpURL}
	}
	args := []string{"worker", "-schema", f.schema, "-queue", f.queue, "-part-queue", f.partQueue, "-pg-url", f.pgURL,
		"-amqp-url", f.amqpURL, "-gateway-url", f.gatewayURL}
	switch i {
	case 0:
		args = append(args, "-ordered-queue", f.orderedQueue, "-stream", f.stream, "-stream-url", f.streamURL, "-health", r.healthAddr)
	case dispatcherProc:
		args = []string{"worker", "-schema", f.schema, "-pg-url", f.pgURL, "-dispatcher"}
	}
	return args
}

// close stops the workers and removes what the run made.
func (r *runner) close() {
	for _, p := range r.procs {
		if p != nil {
			p.stop()
		}
	}
	if r.pub != nil {
		r.pub.close()
	}
	r.pgProxies.Resume()
	if err := r.healCluster(context.Background()); err != nil {
		fmt.Fprintln(r.logOut, "chaos: putting the cluster back:", err)
	}
	r.proxyTB.cleanup()
	if r.gw != nil {
		r.gw.close()
	}

	if !r.keep {
		r.dropQueues()
		if r.pool != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, _ = r.pool.Exec(ctx, "DROP SCHEMA "+r.tables.QuotedSchema()+" CASCADE")
			cancel()
		}
		_ = os.RemoveAll(r.dir)
	} else {
		fmt.Fprintf(r.logOut, "chaos: kept schema %s, queues %s*, logs in %s\n", r.schema, r.queue, r.dir)
	}
	if r.pool != nil {
		r.pool.Close()
	}
}

func (r *runner) dropQueues() {
	conn, err := r.dialAMQP(context.Background())
	if err != nil {
		return
	}
	defer conn.Close()
	for _, q := range []string{r.queue, r.ordered} {
		for _, name := range []string{q, q + ".retry", q + ".dlq"} {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	}
	for _, name := range append(amqpnames.Queues(r.partQueue, partitionCount), r.stream) {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	}
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(amqpnames.PartitionExchange(r.partQueue), false, false)
		_ = ch.Close()
	}
}

// proxyTB is the testing.TB faultproxy asks for, outside a test: it keeps
// the cleanups and the first failure. Only the methods faultproxy calls
// are implemented.
type proxyTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   error
}

func (t *proxyTB) Helper() {}

func (t *proxyTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *proxyTB) Fatalf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failed == nil {
		t.failed = fmt.Errorf(format, args...)
	}
}

func (t *proxyTB) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *proxyTB) cleanup() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// dialAMQP connects straight to RabbitMQ: to one of the nodes that
// answers, in cluster mode.
func (r *runner) dialAMQP(ctx context.Context) (*amqp.Connection, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, _, err := amqpnodes.Dial(ctx, amqpList(r.amqpURL), amqp.Config{})
	return conn, err
}

// hostPort is the host:port of a URL (def when it names no port).
func hostPort(raw, def string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("chaos: parsing a service URL: %w", err)
	}
	if u.Port() == "" {
		return u.Hostname() + ":" + def, nil
	}
	return u.Host, nil
}

// swapHost returns raw with its host:port replaced by addr.
func swapHost(raw, addr string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Host = addr
	return u.String()
}

// proc is a supervised worker process: started again when it dies.
type proc struct {
	name  string
	args  []string
	start func(args []string) *exec.Cmd
	dir   string
	obs   *observations

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	killed   bool // the runner killed it: not an unexpected exit
	stopping bool
	left     bool // not running, on purpose: the joiner before it joins, after it left
	runs     int
}

func (p *proc) run() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs++
	logPath := filepath.Join(p.dir, fmt.Sprintf("%s.%d.log", p.name, p.runs))
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	cmd := p.start(p.args)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("chaos: starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.killed, p.left = cmd, done, false, false
	go func() { // owned: ends when the process does
		err := cmd.Wait()
		_ = log.Close()
		p.mu.Lock()
		unexpected := !p.killed && !p.stopping
		p.mu.Unlock()
		if unexpected {
			last := lastLine(logPath)
			p.obs.note(func(o *observations) { o.exits = append(o.exits, fmt.Sprintf("%s: %v: %s", p.name, err, last)) })
		}
		close(done)
	}()
	return nil
}

// kill SIGKILLs the process, waits for it, and starts it again.
func (p *proc) kill() error {
	p.mu.Lock()
	p.killed = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("chaos: %s did not die of SIGKILL within 10s", p.name)
	}
	return p.run()
}

// join starts the process if it is not running.
func (p *proc) join() error {
	p.mu.Lock()
	left := p.left
	p.mu.Unlock()
	if !left {
		return nil
	}
	return p.run()
}

// leave ends the process, SIGKILL or stopped, and leaves it ended.
func (p *proc) leave(kill bool) error {
	p.mu.Lock()
	if p.left {
		p.mu.Unlock()
		return nil
	}
	p.left, p.killed = true, true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if !kill {
		p.stop()
		p.mu.Lock()
		p.stopping = false
		p.mu.Unlock()
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("chaos: %s did not die of SIGKILL within 10s", p.name)
	}
}

// stop ends the process: SIGTERM, then SIGKILL after 10s.
func (p *proc) stop() {
	p.mu.Lock()
	p.stopping = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// alive restarts a process that died on its own, so that the schedule
// goes on (the exit is reported).
func (p *proc) alive() error {
	p.mu.Lock()
	done, left := p.done, p.left
	p.mu.Unlock()
	if left {
		return nil
	}
	select {
	case <-done:
		return p.run()
	default:
		return nil
	}
}

// lastLine is the last line of a worker's log: why it exited.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// door counts one thing a door did, for the report.
func (r *runner) door(what string) { r.obs.note(func(o *observations) { o.doors[what]++ }) }
