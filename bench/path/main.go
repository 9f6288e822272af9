// Command path measures how a reader follows one new message through the
// library: for one queue message and one stream record on their success
// path (delivery or read, handler, commit, ack or checkpoint, the count in
// Stats), which files the message's code enters, in which order, and how
// many times each. It fails when a file of the runtime is entered more
// than -max-entries times (2), when the path runs through more than
// -max-files files of the runtime (10), or when the numbered paths in
// internal/engine's package doc (-doc) do not list the files it entered,
// in order. make path runs it and writes its report to -golden
// (bench/path/testdata/path.txt), which a unit test compares with the doc
// without the services.
//
// # Entries, and how they are counted
//
// A file is entered when a function of another file calls a function of
// this one: the reader jumps there in an editor. A return is not an entry
// (the reader goes back to where they were). Where the message crosses to
// another goroutine, the reader follows it: a goroutine the path starts
// continues from the function that started it (a go statement in the same
// file enters nothing); a goroutine that was waiting for the message (the
// router's and the workers' loops, the stream reader's) is entered at the
// file of its waiting function, unless the reader is already there; a
// goroutine of a dependency (the stream client's) that calls into the
// library enters the file it calls.
//
// Coverage counters would give the set of code the message ran, not the
// order nor the number of entries, so the command records calls. It writes
// a copy of every library file (not tests, bench/, examples/, cmd/ or the
// test kit) in which each function and function literal begins with a call
// of the recorder (package pathtrace: the file, the function, the
// goroutine, and the nearest caller of the module on its stack), builds
// itself from those copies with go build -overlay (the tree is left as it
// is), and runs that build with -measure. There, on a fresh schema and a
// fresh quorum queue, then a fresh stream, it starts a consumer whose
// handler makes one insert with tx.Exec, lets -warmups messages through,
// then for each of -rounds rounds records the calls from publishing one
// new persistent message until Stats count it as processed, plus -grace.
// Each message round is followed by a control round as long, polling Stats
// the same way, with no message. The message's calls are those, identified
// by caller and callee, recorded in every message round and in no control
// round: what the background (heartbeats, health probes, the lag sampler)
// and the polling itself run cancels out.
//
// The report lists each path's entries in order, numbered, with the
// function entered and where from, then the count of entries per file.
// Files of the runtime packages (stationPackages: the sources, the engine,
// the inbox, the stream's reading and its checkpoint) are counted against
// the limits; the others on the path (the root package's value types, leaf
// utilities such as internal/sqltext) are listed as helpers, not counted.
//
// Run it from the module root: go run ./bench/path, or make path.
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ (with
// streams on port 5552) are. The schemas, queues and streams it creates are
// removed at the end, also after a failure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/idemkit/idem/bench/path/pathtrace"
)

// buildHint says how the measuring binary is built, for the errors of a
// binary built otherwise.
const buildHint = "run go run ./bench/path from the module root, which builds it instrumented"

// options are the command-line flags.
type options struct {
	pgURL, amqpURL string
	rounds         int           // message rounds, each with its control round
	warmups        int           // messages processed before the first round
	grace          time.Duration // wait after the message settled, before the recording stops
	quiet          time.Duration // pause before each round, for the previous one's tail to end
	timeout        time.Duration // longest wait for one message to settle
	goCmd          string        // the go command that builds the instrumented binary
	doc            string        // the file whose package doc walks the paths; empty: no check
	golden         string        // write the report there too; empty: stdout only
	keep           string        // keep the instrumented build and its recording there
	maxEntries     int           // fail when a file of the runtime is entered more often
	maxFiles       int           // fail when a path runs through more files of the runtime
	measure        string        // set in the instrumented build: record, and write the recording there
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "bench/path:", err)
		os.Exit(1)
	}
}

// run builds the instrumented binary, has it record the paths, and
// reports and checks them; in the instrumented binary (-measure), it
// records.
func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if o.measure != "" {
		return record(ctx, o, root)
	}
	dir := o.keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-path-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("run from the module root: %w", err)
	}
	logf("building an instrumented copy of the library")
	bin, err := buildTraced(ctx, o.goCmd, root, dir)
	if err != nil {
		return err
	}
	rec, err := measureWith(ctx, bin, root, dir, o)
	if err != nil {
		return err
	}
	return report(rec, o, root)
}

// measureWith runs the instrumented binary bin and reads its recording.
func measureWith(ctx context.Context, bin, root, dir string, o options) (*traceFile, error) {
	out := filepath.Join(dir, "trace.json")
	cmd := exec.CommandContext(ctx, bin, "-measure", out, "-rounds", strconv.Itoa(o.rounds),
		"-warmups", strconv.Itoa(o.warmups), "-grace", o.grace.String(), "-quiet", o.quiet.String(),
		"-timeout", o.timeout.String())
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the instrumented run: %w", err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	var rec traceFile
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("read the recording: %w", err)
	}
	return &rec, nil
}

// traceFile is what the instrumented binary recorded, per source.
type traceFile struct {
	Queue  recording `json:"queue"`
	Stream recording `json:"stream"`
}

// record runs, in the instrumented binary, the rounds of each source and
// writes what they recorded to o.measure.
func record(ctx context.Context, o options, root string) error {
	pathtrace.SetRoot(root)
	var rec traceFile
	for _, source := range []string{sourceQueue, sourceStream} {
		r, err := setup(ctx, o, source)
		if err != nil {
			return err
		}
		got, err := r.measure(ctx)
		r.cleanup()
		if err != nil {
			return err
		}
		if source == sourceQueue {
			rec.Queue = got
		} else {
			rec.Stream = got
		}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return os.WriteFile(o.measure, data, 0o644)
}

// parse reads the flags and the environment.
func parse(args []string) (options, error) {
	o := options{
		pgURL:   env("IDEM_PG_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"),
		amqpURL: env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
	}
	fs := flag.NewFlagSet("bench/path", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 3, "message rounds, each followed by a control round without a message")
	fs.IntVar(&o.warmups, "warmups", 2, "messages processed before the first round")
	fs.DurationVar(&o.grace, "grace", 30*time.Millisecond, "wait after the message is counted, before the recording stops")
	fs.DurationVar(&o.quiet, "quiet", 300*time.Millisecond, "pause before each round")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "longest wait for a message to be counted")
	fs.StringVar(&o.goCmd, "go", "go", "the go command that builds the instrumented binary")
	fs.StringVar(&o.doc, "doc", "internal/engine/doc.go", "the file whose package doc numbers the paths (empty: no check)")
	fs.StringVar(&o.golden, "golden", "", "write the report to this file too")
	fs.StringVar(&o.keep, "keep", "", "keep the instrumented build and its recording in this directory")
	fs.IntVar(&o.maxEntries, "max-entries", 2, "fail when a file of the runtime is entered more often than this (0: no limit)")
	fs.IntVar(&o.maxFiles, "max-files", 10, "fail when a path runs through more files of the runtime than this (0: no limit)")
	fs.StringVar(&o.measure, "measure", "", "record, and write the recording to this file (the instrumented build only)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.rounds <= 0 || o.warmups < 0 || o.grace < 0 || o.quiet < 0 || o.timeout <= 0 {
		return o, errors.New("-rounds and -timeout must be positive, -warmups, -grace and -quiet not negative")
	}
	return o, nil
}

// env returns the environment variable key, or def when it is empty.
func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// logf reports progress on stderr; the report goes to stdout.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/path: "+format+"\n", args...)
}
