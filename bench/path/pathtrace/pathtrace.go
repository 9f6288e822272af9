// Package pathtrace records, in order, the calls of the functions of an
// instrumented build of the module, for bench/path. The module's own code
// never imports it: bench/path builds a copy of the library in which every
// function and function literal begins with
//
//	defer pathtrace.Enter("inbox/claim.go", "Inbox.ClaimNewBatch")()
//
// (see the command's doc), runs one message through it between Start and
// Stop, and reads the calls back. Enter is a no-op outside Start and Stop.
//
// The recorder is a package variable because the instrumented functions
// have no handle to pass it: it exists only in that measurement build.
package pathtrace

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Event is one call, or its return, of an instrumented function.
type Event struct {
	// Seq orders the events of a recording.
	Seq int64 `json:"seq"`
	// G is the goroutine the call ran on.
	G int64 `json:"g"`
	// File is the function's file, relative to the module root; Func its
	// name: Func, Recv.Method, Outer.funcN for the Nth literal of Outer.
	File string `json:"file"`
	Func string `json:"func"`
	// Return marks the function's return (its deferred exit).
	Return bool `json:"return,omitempty"`
	// CallerFile and CallerFunc name the nearest frame of the module above
	// the call on its goroutine's stack (its caller, past any frame of the
	// standard library or a dependency). On a goroutine with no frame of
	// the module above the call, they name the function that started the
	// goroutine when it is the module's, and Spawned is set; else they are
	// empty: a dependency's goroutine called into the module.
	CallerFile string `json:"caller_file,omitempty"`
	CallerFunc string `json:"caller_func,omitempty"`
	Spawned    bool   `json:"spawned,omitempty"`
}

// maxEvents bounds a recording; the calls beyond it are counted, not kept.
const maxEvents = 1 << 20

var rec struct {
	on      atomic.Bool
	seq     atomic.Int64
	root    atomic.Pointer[string] // the module root, with a trailing slash
	mu      sync.Mutex
	events  []Event
	dropped int
}

// SetRoot sets the module root, the directory whose files are the module's
// frames. Call it once before Start.
func SetRoot(dir string) {
	dir = strings.TrimSuffix(dir, "/") + "/"
	rec.root.Store(&dir)
}

// Start begins a recording, discarding the last one.
func Start() {
	rec.mu.Lock()
	rec.events, rec.dropped = rec.events[:0], 0
	rec.mu.Unlock()
	rec.on.Store(true)
}

// Stop ends the recording and returns its events, in order, and how many
// calls it could not keep (beyond maxEvents).
func Stop() ([]Event, int) {
	rec.on.Store(false)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]Event, len(rec.events))
	copy(out, rec.events)
	return out, rec.dropped
}

func noop() {}

// Enter records a call of function fn of file, and returns what records
// its return: the instrumented function defers it.
//
//go:noinline
func Enter(file, fn string) func() {
	if !rec.on.Load() {
		return noop
	}
	e := Event{G: goid(), File: file, Func: fn}
	e.CallerFile, e.CallerFunc, e.Spawned = caller()
	add(e)
	return func() {
		if rec.on.Load() {
			add(Event{G: e.G, File: file, Func: fn, Return: true})
		}
	}
}

// add appends e with the next sequence number.
func add(e Event) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	e.Seq = rec.seq.Add(1)
	if len(rec.events) >= maxEvents {
		rec.dropped++
		return
	}
	rec.events = append(rec.events, e)
}

// caller names the nearest frame of the module above the instrumented
// function that called Enter, or the function that started the goroutine
// (spawned).
//
//go:noinline
func caller() (file, fn string, spawned bool) {
	root := rec.root.Load()
	if root == nil {
		return "", "", false
	}
	var pcs [128]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs[:])])
	// Past Enter, then past the instrumented function itself.
	passed := 0
	for {
		f, more := frames.Next()
		switch {
		case passed == 0:
			if strings.HasSuffix(f.Function, "/pathtrace.Enter") {
				passed = 1
			}
		case passed == 1:
			passed = 2
		default:
			if rel, ok := strings.CutPrefix(f.File, *root); ok && !thirdParty(rel) {
				return rel, shortName(f.Function), false
			}
		}
		if !more {
			break
		}
	}
	return creator(*root)
}

// creator names the function that started the calling goroutine, when it
// is the module's: the last two lines of its stack trace,
//
//	created by github.com/idemkit/idem/internal/engine.(*Engine).supervised in goroutine 42
//		/root/internal/engine/run.go:193 +0x1c5
func creator(root string) (file, fn string, spawned bool) {
	buf := make([]byte, 64<<10)
	buf = buf[:runtime.Stack(buf, false)]
	i := bytes.LastIndex(buf, []byte("\ncreated by "))
	if i < 0 {
		return "", "", false
	}
	lines := strings.SplitN(string(buf[i+1:]), "\n", 3)
	if len(lines) < 2 {
		return "", "", false
	}
	name := strings.TrimPrefix(lines[0], "created by ")
	if j := strings.Index(name, " in goroutine "); j >= 0 {
		name = name[:j]
	}
	where := strings.TrimSpace(lines[1])
	if j := strings.LastIndexByte(where, ':'); j >= 0 {
		where = where[:j]
	}
	rel, ok := strings.CutPrefix(where, root)
	if !ok || thirdParty(rel) {
		return "", "", false
	}
	return rel, shortName(name), true
}

// thirdParty reports whether rel, a file of the module, is a third
// party's code copied into it (internal/streamclient, the stream client):
// a frame there is a dependency's, as it was before the copy.
func thirdParty(rel string) bool { return strings.HasPrefix(rel, "internal/streamclient/") }

// shortName drops the package path of a function's name as the runtime
// writes it: github.com/idemkit/idem/inbox.(*Inbox).ClaimNewBatch becomes
// Inbox.ClaimNewBatch.
func shortName(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		full = full[i+1:]
	}
	if i := strings.IndexByte(full, '.'); i >= 0 {
		full = full[i+1:]
	}
	full = strings.ReplaceAll(full, "(*", "")
	return strings.ReplaceAll(full, ")", "")
}

// goid is the calling goroutine's id, read from the first line of its
// stack trace ("goroutine 42 [running]:").
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b, _ = bytes.CutPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	n, _ := strconv.ParseInt(string(b), 10, 64)
	return n
}
