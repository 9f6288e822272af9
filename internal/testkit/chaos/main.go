// Command chaos is idem's generative soak: from a seed it generates
// schedules of the actions a year of production holds, runs them against
// the real broker and database with worker processes written for it, and
// checks the outcome against a model of what must hold. A schedule that
// breaks an invariant is shrunk by delta debugging to a minimal list of
// actions and saved under testdata/chaos, which `go test` replays.
//
// The actions (plan.go): publishes (new; the same id again; the same body
// under a new id; a conflicting payload; a numeric id spelt another way,
// 1000, 1000.0 or 1e3; a body that is not JSON; a body without an id; an
// oversized body; a header table nested 40 deep, which the client library
// cannot decode; keyed messages whose order must hold, on an ordered queue
// and on a partitioned one, some failing their first attempt), charges
// through the ledger to a fake gateway that does not deduplicate (2xx, 503
// before the charge, 502 after it, 409 in progress, a connection dropped
// after the charge, slowness, an answer after the dispatcher's timeout),
// stream publishes, replays of the stream from random offsets (normal,
// forensic, repair), online rebuilds of its projection (finished, killed
// and resumed, killed and abandoned), requests to an Idempotency-Key
// endpoint (a new key, a retry, a race, another body under a used key, a
// key past its expiry, a request whose edge process is killed under it),
// kill -9 of a worker, of the dispatcher or of the edge process, a process
// joining and leaving the partitioned consumer, every broker connection
// cut, PostgreSQL refused or blackholed (internal/testkit/faultproxy) and
// healed, retention at a cutoff at or above its floor, redrives of dead
// letters by id, by reason or all, operators resolving unknown charges,
// and waits.
//
// The oracle (oracle.go; stream.go for the stream) checks, once the schedule is done and
// the workers settled: every message applied exactly once or refused with
// a named reason; a second payload under an id dead-lettered as
// payload_conflict; the gateway charged each key at most once; a charge
// that happened is succeeded or unknown in the ledger; an applied charge
// message has one effect and no other message any; each key's messages
// applied once each in publish order, on the ordered and the partitioned
// queue; nothing lost; every dead letter has a row with a known reason and
// every copy in a dead-letter queue its row; an undecodable message
// dead-lettered alone; queues drain; no worker exits unasked; an
// Idempotency-Key runs once and answers one stored response; each stream
// message applied once and the projection holding each once. While it
// runs: readiness reports each PostgreSQL outage; an undecodable message
// is dead-lettered within 30s; a forensic replay changes nothing; a normal
// replay from at or below the inbox horizon is refused; a rebuild swaps
// its tables in, and a killed or abandoned one leaves the live projection
// as it was; a key past its expiry is refused; a request whose edge died
// under it is done once retried. docs/testing.md has the details. Its
// report counts actions by kind, what the doors did, and checks by
// invariant; a run that left an invariant unchecked fails.
//
//	go run ./internal/testkit/chaos [-cluster] [-seed N] [-duration 3m] [-actions 30] [-plan] [-case FILE] [-save DIR] [-name NAME]
//
// -cluster runs on the topology of scripts/cluster.sh (up --sync; make
// chaos-cluster starts and removes it) instead of the single-box
// services, and adds the faults only it can take: kill -9 of a RabbitMQ
// node, started again a few actions later, and a crash of the PostgreSQL
// primary (pg_ctl -m immediate), started again (crash recovery) or failed
// over to the standby, the old primary rejoining as its standby. A
// cluster run must have killed a node and crashed the primary to pass.
// Its failing schedules are saved under testdata/chaos/cluster, which the
// single-box replay of testdata/chaos does not read; -cluster -case
// replays one.
//
// -plan prints the schedule of seed N, one action a line, and exits. A run
// of -duration runs schedules of seeds N, N+1, N+2, … until the budget is
// spent, and then at most -cover-extra longer while an invariant is still
// unchecked (0 on the single box; in cluster mode, whose schedules are
// slower, -duration again); the first that fails is shrunk (within
// -shrink-budget) and saved in -save as NAME.json. -case replays a saved case. The same seed gives
// the same actions in the same order; their timing against the workers
// differs from run to run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// Exit codes.
const (
	exitPass   = 0
	exitFail   = 1 // an invariant broke
	exitNotRun = 2 // the run could not happen (flags, services)
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what one chaos run does.
type config struct {
	seed         uint64
	duration     time.Duration
	actions      int
	plan         bool
	casePath     string
	save, name   string
	fault        string
	shrinkBudget time.Duration
	keep         bool
	cluster      bool
	coverExtra   time.Duration
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runWorker(ctx, args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "edge" {
		return runEdge(ctx, args[1:], stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitPass
	}
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitNotRun
	}
	if cfg.plan {
		for _, a := range generateFor(cfg.seed, cfg.actions, cfg.cluster) {
			fmt.Fprintln(stdout, a)
		}
		return exitPass
	}
	e, err := selfEnv(stderr, cfg.keep)
	if err == nil && cfg.cluster {
		err = clusterEnv(ctx, &e)
	}
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitNotRun
	}
	if cfg.casePath != "" {
		return replayCase(ctx, e, cfg.casePath, stdout, stderr)
	}
	return soak(ctx, e, cfg, stdout, stderr)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the first schedule (0: a fresh one, printed)")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Minute, "run schedules until this budget is spent (the shrinking of a failure is not counted)")
	fs.IntVar(&cfg.actions, "actions", 30, "actions per schedule")
	fs.BoolVar(&cfg.plan, "plan", false, "print the schedule of -seed, one action a line, and exit")
	fs.StringVar(&cfg.casePath, "case", "", "replay this saved case instead")
	fs.StringVar(&cfg.save, "save", "testdata/chaos", "where a shrunk failing schedule is saved")
	fs.StringVar(&cfg.name, "name", "", "its file name, without .json (default: seed-N)")
	fs.StringVar(&cfg.fault, "fault", "", "what the code under test is known to get wrong, written in the saved case")
	fs.DurationVar(&cfg.shrinkBudget, "shrink-budget", 10*time.Minute, "time allowed to shrink a failing schedule")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the schemas, queues and worker logs")
	fs.BoolVar(&cfg.cluster, "cluster", false, "run on the topology of scripts/cluster.sh, with node kills and PostgreSQL crashes")
	fs.DurationVar(&cfg.coverExtra, "cover-extra", -1, "once -duration is spent, go on at most this long while an invariant is unchecked (default: 0; in -cluster mode, -duration)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	saveSet := false
	fs.Visit(func(f *flag.Flag) { saveSet = saveSet || f.Name == "save" })
	if cfg.cluster && !saveSet {
		cfg.save = clusterSaveDir
	}
	if cfg.coverExtra < 0 {
		cfg.coverExtra = 0
		if cfg.cluster {
			cfg.coverExtra = cfg.duration // its schedules are slower: fewer of them fit
		}
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.actions < 1 || cfg.duration <= 0 {
		return cfg, errors.New("-actions and -duration must be positive")
	}
	if cfg.seed == 0 {
		cfg.seed = rand.Uint64N(1 << 31)
	}
	return cfg, nil
}

// selfEnv runs workers as this very binary's `worker` subcommand.
func selfEnv(logOut io.Writer, keep bool) (env, error) {
	exe, err := os.Executable()
	if err != nil {
		return env{}, err
	}
	return env{pgURL: testdb.URL(), amqpURL: testbroker.URL(), logOut: logOut, keep: keep,
		worker: func(args []string) *exec.Cmd { return exec.Command(exe, args...) }}, nil
}

// clusterSaveDir is where cluster mode saves a failing schedule: beside
// the single-box cases, in a directory their replay does not read.
const clusterSaveDir = "testdata/chaos/cluster"

// clusterEnv points e at the topology of scripts/cluster.sh.
func clusterEnv(ctx context.Context, e *env) error {
	t, err := openTopology(ctx)
	if err != nil {
		return err
	}
	e.cluster, e.amqpURL, e.pgURL, e.streamURL = t, strings.Join(t.amqpURLs, ","), t.pgURL, t.streamURLs
	return nil
}

// soak runs schedules until the budget is spent, then shrinks and saves
// the first that failed.
func soak(ctx context.Context, e env, cfg config, stdout, stderr io.Writer) int {
	target := "chaos"
	if cfg.cluster {
		target = "chaos-cluster"
	}
	fmt.Fprintf(stdout, "chaos: seed %d (replay: make %s SEED=%d)\n", cfg.seed, target, cfg.seed)
	start := time.Now()
	t := &total{Seed: cfg.seed, All: true, Cluster: cfg.cluster}
	for i := uint64(0); ctx.Err() == nil && goOn(t, cfg, time.Since(start), stderr); i++ {
		seed := cfg.seed + i
		actions := generateFor(seed, cfg.actions, cfg.cluster)
		rep, err := runSchedule(ctx, e, seed, actions)
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return exitNotRun
		}
		t.add(rep)
		fmt.Fprintf(stderr, "chaos: schedule %d (seed %d) %s after %s\n", i, seed, verdict(rep.pass()), time.Since(start).Round(time.Second))
		if !rep.pass() {
			found := time.Since(start)
			t.print(stdout)
			shrinkAndSave(ctx, e, cfg, rep, actions, found, stdout, stderr)
			return exitFail
		}
	}
	t.print(stdout)
	if !t.pass() {
		return exitFail
	}
	return exitPass
}

// goOn says whether the run starts another schedule after elapsed: within
// -duration, or within -cover-extra more while some invariant (or, in
// cluster mode, a cluster fault) is still unchecked.
func goOn(t *total, cfg config, elapsed time.Duration, stderr io.Writer) bool {
	if elapsed < cfg.duration {
		return true
	}
	missing := t.missing()
	if len(missing) == 0 || elapsed >= cfg.duration+cfg.coverExtra {
		return false
	}
	fmt.Fprintf(stderr, "chaos: %s spent, going on (at most %s more) until checked: %s\n",
		cfg.duration, (cfg.duration + cfg.coverExtra - elapsed).Round(time.Second), strings.Join(missing, ", "))
	return true
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func shrinkAndSave(ctx context.Context, e env, cfg config, rep *report, actions []Action, found time.Duration, stdout, stderr io.Writer) {
	s := &shrinker{env: e, seed: rep.Seed, broke: rep.failed(), until: time.Now().Add(cfg.shrinkBudget),
		logf: func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }}
	began := time.Now()
	small, note := actions, "did not fail again in %[3]d runs of the whole schedule: its failure depends on timing; saved as found"
	if s.reproduces(ctx, actions) {
		small, note = s.ddmin(ctx, actions), "shrunk from %[1]d to %[2]d actions"
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "chaos: interrupted while shrinking; nothing saved (its schedule: -seed %d -plan)\n", rep.Seed)
		return
	}
	name := cfg.name
	if name == "" {
		name = fmt.Sprintf("seed-%d", rep.Seed)
	}
	c := savedCase{Name: name, Fault: cfg.fault, Broke: rep.failed(), Seed: rep.Seed, Found: len(actions), Cluster: cfg.cluster, Actions: small}
	path, err := c.write(cfg.save)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return
	}
	fmt.Fprintf(stdout, "\nfound after %.1f minutes; %s in %d trials (%.1f minutes); saved %s\n",
		found.Minutes(), fmt.Sprintf(note, len(actions), len(small), reproduceTries), s.trials, time.Since(began).Minutes(), path)
	for _, a := range small {
		fmt.Fprintln(stdout, "  "+a.String())
	}
}

// replayCase runs a saved case once: every invariant must hold.
func replayCase(ctx context.Context, e env, path string, stdout, stderr io.Writer) int {
	c, err := readCase(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitNotRun
	}
	if c.Cluster && e.cluster == nil {
		fmt.Fprintf(stderr, "chaos: %s is a cluster case: replay it with -cluster (make chaos-cluster CHAOS_CASE=%s)\n", path, path)
		return exitNotRun
	}
	rep, err := runSchedule(ctx, e, c.Seed, c.Actions)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitNotRun
	}
	t := &total{Seed: c.Seed}
	t.add(rep)
	t.print(stdout)
	if !rep.pass() {
		return exitFail
	}
	return exitPass
}
