package main

import (
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/bench/path/pathtrace"
)

// call and ret build the events of a synthetic round.
func call(g int64, file, fn, from, fromFn string) pathtrace.Event {
	return pathtrace.Event{G: g, File: file, Func: fn, CallerFile: from, CallerFunc: fromFn}
}

func ret(g int64, file, fn string) pathtrace.Event {
	return pathtrace.Event{G: g, File: file, Func: fn, Return: true}
}

// A queue-like round: a waiting router loop picks the message up, calls
// within its file and into two others, hands it to a waiting worker in the
// same file, whose batch starts a goroutine of its own; the user's handler
// calls back into the engine; a helper's call on another goroutine moves
// nobody.
func TestEntriesAreCallsFromAnotherFileAndTheWaitingLoopsOfTheMessage(t *testing.T) {
	const src, eng, run, hnd = "consumer/source.go", "internal/engine/engine.go", "internal/engine/run.go", "internal/engine/handlers.go"
	events := []pathtrace.Event{
		call(1, src, "router.burst", src, "router.loop"), // waited on the channel
		call(1, eng, "Engine.PrepareAll", src, "router.burst"),
		call(1, "hash.go", "HashBytes", eng, "Engine.derive"),
		ret(1, "hash.go", "HashBytes"),
		ret(1, eng, "Engine.PrepareAll"),
		call(9, "internal/amqpconn/gate.go", "gatedConn.Read", "", ""), // the client's reader, concurrently
		call(1, src, "router.route", src, "router.burst"),
		ret(1, src, "router.route"),
		ret(1, src, "router.burst"),
		call(2, src, "queueSource.runBatch", src, "queueSource.worker"), // the worker waited in source.go
		call(2, run, "Engine.Run", src, "queueSource.runBatch"),
		{G: 3, File: run, Func: "Engine.supervised.func1", CallerFile: run, CallerFunc: "Engine.supervised", Spawned: true},
		call(3, hnd, "batch.runHandlers", run, "Engine.supervised.func1"),
		call(3, hnd, "handlerTx.Exec", "bench/path/setup.go", "rig.newConsumer.func1"),
		ret(3, hnd, "handlerTx.Exec"),
		ret(3, hnd, "batch.runHandlers"),
		ret(3, run, "Engine.supervised.func1"),
		ret(2, run, "Engine.Run"),
		call(2, eng, "Engine.Count", src, "queueSource.runBatch"),
	}
	got := entries(events)
	require.Equal(t, []string{src, eng, "hash.go", "internal/amqpconn/gate.go", run, hnd, hnd, eng}, files(got))
	require.True(t, got[0].Waiting)
	require.Equal(t, "router.loop", got[0].Func)
	require.Equal(t, map[string]int{src: 1, eng: 2, "hash.go": 1, "internal/amqpconn/gate.go": 1, run: 1, hnd: 2}, countEntries(got))
	require.Equal(t, []string{src, eng, run, hnd, hnd, eng}, files(stations(got)))
}

// A goroutine that waited for the message in another file than the one the
// reader is in is entered there first.
func TestAWaitingLoopInAnotherFileIsEnteredThere(t *testing.T) {
	events := []pathtrace.Event{
		call(1, "consumer/streamsource.go", "reader.batch", "internal/streamio/read.go", "Env.Follow"),
		call(1, "internal/engine/ordered.go", "Engine.RunOrdered", "consumer/streamsource.go", "reader.batch"),
	}
	got := entries(events)
	require.Equal(t, []string{"internal/streamio/read.go", "consumer/streamsource.go", "internal/engine/ordered.go"}, files(got))
	require.True(t, got[0].Waiting)
}

// The path is the calls, by caller and callee, recorded in every message
// round and in no control round; a round's calls keep their returns.
func TestThePathIsTheCallsOfEveryMessageRoundAndOfNoControlRound(t *testing.T) {
	const a, b = "consumer/source.go", "internal/engine/run.go"
	msg := []pathtrace.Event{
		call(1, b, "Engine.Run", a, "queueSource.runBatch"),
		call(1, "consumer/stats.go", "Consumer.Stats", "bench/path/rounds.go", "rig.poll"),
		ret(1, "consumer/stats.go", "Consumer.Stats"),
		ret(1, b, "Engine.Run"),
	}
	once := append(slices.Clone(msg), call(5, b, "Engine.logRetry", b, "Engine.run"))
	rec := recording{
		Messages: [][]pathtrace.Event{msg, once, msg},
		Controls: [][]pathtrace.Event{{call(1, "consumer/stats.go", "Consumer.Stats", "bench/path/rounds.go", "rig.poll")}},
	}
	p, err := analyze(queuePath, rec)
	require.NoError(t, err)
	require.Equal(t, []string{a, b}, files(p.entries), "the caller waited in a: the reader starts there")
	require.Equal(t, map[string]int{a: 1, b: 1}, p.most)
}

func TestCheckFailsAboveTheLimits(t *testing.T) {
	p := &sourcePath{name: queuePath, most: map[string]int{
		"internal/engine/handlers.go": 3, "internal/engine/run.go": 1, "hash.go": 5,
	}}
	require.Equal(t, []string{"queue message: internal/engine/handlers.go is entered 3 times, more than 2"}, p.check(2, 10))
	require.Equal(t, []string{"queue message: the path runs through 2 files of the runtime, more than 1"}, p.check(3, 1))
	require.Empty(t, p.check(3, 2), "a helper (hash.go) is not counted")
}

func TestStationsAreTheRuntimePackagesFiles(t *testing.T) {
	for file, want := range map[string]bool{
		"consumer/window.go":                true,
		"consumer/streamsource.go":          true,
		"internal/engine/attempt.go":        true,
		"inbox/claim.go":                    true,
		"inbox/httpinbox/handler.go":        false,
		"hash.go":                           false,
		"internal/sqltext/sqltext.go":       false,
		"internal/streamio/subscription.go": false,
		"internal/store/checkpoint.go":      false,
	} {
		require.Equal(t, want, stationOf(file), file)
	}
}

// The instrumented copy of a file records each function and function
// literal, and keeps every line where it was.
func TestInstrumentRecordsEveryFunctionOnItsOwnLine(t *testing.T) {
	const src = `package x // the package

import "fmt"

type T struct{}

func (t *T) M() { fmt.Println(func() int { return 1 }()) }

var v = func() {}

func F() {
	go func() {}()
}

func decl()
`
	out, err := instrument("x/x.go", []byte(src))
	require.NoError(t, err)
	text := string(out)
	require.Equal(t, strings.Count(src, "\n"), strings.Count(text, "\n"))
	for _, name := range []string{`"T.M"`, `"T.M.func1"`, `"glob.func1"`, `"F"`, `"F.func1"`} {
		require.Contains(t, text, `defer idempathtrace.Enter("x/x.go", `+name+`)();`)
	}
	require.NotContains(t, text, `"decl"`)
	require.True(t, strings.HasPrefix(text, `package x; import idempathtrace "github.com/idemkit/idem/bench/path/pathtrace" // the package`))
	_, err = parser.ParseFile(token.NewFileSet(), "x.go", out, 0)
	require.NoError(t, err)

	none, err := instrument("x/types.go", []byte("package x\n\ntype U int\n"))
	require.NoError(t, err)
	require.Nil(t, none, "a file without functions is left as it is")
}

func TestLibraryFilesAreNotTestsBenchExamplesCommandsOrTheTestKit(t *testing.T) {
	for file, want := range map[string]bool{
		"hash.go":                           true,
		"internal/engine/attempt.go":        true,
		"internal/engine/attempt_test.go":   false,
		"bench/path/main.go":                false,
		"examples/payments/main.go":         false,
		"cmd/idem/main.go":                  false,
		"internal/testkit/testdb/testdb.go": false,
		"README.md":                         false,
	} {
		require.Equal(t, want, library(file), file)
	}
}

// The engine's package doc numbers the paths make path measured last
// (testdata/path.txt, which make path writes): a change of either that the
// other does not follow fails here, without the services.
func TestTheEnginesDocNumbersTheMeasuredPaths(t *testing.T) {
	doc, err := os.Open("../../internal/engine/doc.go")
	require.NoError(t, err)
	defer doc.Close()
	documented, err := numberedPaths(doc)
	require.NoError(t, err)
	golden, err := os.Open("testdata/path.txt")
	require.NoError(t, err)
	defer golden.Close()
	measured, err := numberedPaths(golden)
	require.NoError(t, err)
	require.Equal(t, measured, documented, "internal/engine/doc.go numbers other files than make path entered (testdata/path.txt): run make path, and follow it in the doc")
}

func TestNumberedPathsReadsEachSectionInOrder(t *testing.T) {
	const doc = `// Package x.
//
// # The path of a queue message
//
//  1. consumer/source.go: takes it.
//     Back in 2 places.
//  2. internal/engine/run.go: runs it.
//
// # The path of a stream record
//
//  1. consumer/streamsource.go: reads it.
//
// # Another section
//
//  1. other.go: not a path.
package x
`
	got, err := numberedPaths(strings.NewReader(doc))
	require.NoError(t, err)
	require.Equal(t, map[string][]string{
		queuePath:  {"consumer/source.go", "internal/engine/run.go"},
		streamPath: {"consumer/streamsource.go"},
	}, got)
	_, err = numberedPaths(strings.NewReader("// # The path of a queue message\n//  2. a.go: skipped one.\n"))
	require.Error(t, err)
}
