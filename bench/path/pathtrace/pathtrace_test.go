package pathtrace

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// outer and inner stand for instrumented functions of two files.
func outer() {
	defer Enter("a.go", "outer")()
	inner()
}

func inner() { defer Enter("b.go", "inner")() }

// Each call names the nearest frame of the module above it; a goroutine
// with none names the function that started it.
func TestEnterRecordsCallsWithTheirCallerInOrder(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(here)))) // bench/path/pathtrace/x_test.go
	SetRoot(root)
	outer() // not recording: nothing kept
	Start()
	outer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer Enter("c.go", "spawned")()
	}()
	<-done
	events, dropped := Stop()
	require.Zero(t, dropped)
	require.Len(t, events, 6)
	const file = "bench/path/pathtrace/pathtrace_test.go"
	want := []Event{
		{File: "a.go", Func: "outer", CallerFile: file, CallerFunc: "TestEnterRecordsCallsWithTheirCallerInOrder"},
		{File: "b.go", Func: "inner", CallerFile: file, CallerFunc: "outer"},
		{File: "b.go", Func: "inner", Return: true},
		{File: "a.go", Func: "outer", Return: true},
		{File: "c.go", Func: "spawned", CallerFile: file, CallerFunc: "TestEnterRecordsCallsWithTheirCallerInOrder", Spawned: true},
		{File: "c.go", Func: "spawned", Return: true},
	}
	for i := range events {
		require.Positive(t, events[i].G)
		if i > 0 {
			require.Greater(t, events[i].Seq, events[i-1].Seq)
		}
		events[i].G, events[i].Seq = 0, 0
	}
	require.Equal(t, want, events)
}

func TestShortNameDropsThePackagePath(t *testing.T) {
	for full, want := range map[string]string{
		"github.com/idemkit/idem/inbox.(*Inbox).ClaimNewBatch":               "Inbox.ClaimNewBatch",
		"github.com/idemkit/idem/internal/engine.(*Engine).supervised.func2": "Engine.supervised.func2",
		"github.com/idemkit/idem.HashBytes":                                  "HashBytes",
		"github.com/idemkit/idem/consumer.session.alive":                     "session.alive",
	} {
		require.Equal(t, want, shortName(full), full)
	}
}
