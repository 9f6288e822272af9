package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/bench/path/pathtrace"
)

// stationPackages are the runtime packages whose files count against the
// limits: the sources (the queue's and the stream's, both in consumer), the
// engine and the inbox. Every other library file on a
// path is a helper: the root package's value types, leaf utilities, and
// the clients' plumbing — internal/amqpconn under the AMQP client's socket,
// internal/streamio around the stream client (its subscription, the
// reading loop that hands a batch to the consumer's stream source), internal/store's
// checkpoint statement — entered for a call and left, as the reader leaves
// amqp091-go or pgx unread.
var stationPackages = []string{"consumer", "internal/engine", "inbox"}

// stationOf reports whether file (relative to the module root) is a file
// of a station package.
func stationOf(file string) bool { return slices.Contains(stationPackages, path.Dir(file)) }

// entry is one time the reader enters a file.
type entry struct {
	File, Func string // the file entered, and the function called there
	// From and FromFunc name the caller: the function of another file that
	// called, or for a goroutine that waited for the message, its waiting
	// function (Waiting). From is empty for a goroutine of a dependency.
	From, FromFunc string
	Waiting        bool
}

// sourcePath is the measured path of one source's message.
type sourcePath struct {
	name      string  // "queue message", "stream record"
	rounds    int     // message rounds, and as many control rounds
	identical bool    // every message round entered the same files in the same order
	entries   []entry // the first round's, in order
	// most is, per file, the most entries of any round.
	most map[string]int
}

// analyze returns the path of rec's message: the calls recorded in every
// message round and in no control round, and the entries they make.
func analyze(name string, rec recording) (*sourcePath, error) {
	if len(rec.Messages) == 0 {
		return nil, fmt.Errorf("%s: no message round recorded", name)
	}
	background := map[string]bool{}
	for _, round := range rec.Controls {
		for _, e := range round {
			if !e.Return {
				background[callKey(e)] = true
			}
		}
	}
	common := map[string]int{}
	for _, round := range rec.Messages {
		seen := map[string]bool{}
		for _, e := range round {
			if k := callKey(e); !e.Return && !seen[k] {
				seen[k] = true
				common[k]++
			}
		}
	}
	keep := func(e pathtrace.Event) bool {
		k := callKey(e)
		return common[k] == len(rec.Messages) && !background[k]
	}
	p := &sourcePath{name: name, rounds: len(rec.Messages), identical: true, most: map[string]int{}}
	for i, round := range rec.Messages {
		entries := entries(onPath(round, keep))
		if i == 0 {
			p.entries = entries
		} else if !slices.Equal(files(stations(entries)), files(p.stations())) {
			p.identical = false
		}
		for file, n := range countEntries(entries) {
			p.most[file] = max(p.most[file], n)
		}
	}
	switch {
	case len(p.entries) == 0:
		return nil, fmt.Errorf("%s: no call on the path: every call recorded with the message was recorded without it too", name)
	case !p.identical:
		return nil, fmt.Errorf("%s: the message rounds entered the files of the runtime in different orders: run again, with more -rounds or a longer -quiet", name)
	}
	return p, nil
}

// callKey identifies a call by its caller and callee.
func callKey(e pathtrace.Event) string {
	return e.CallerFile + "\x00" + e.CallerFunc + "\x00" + e.File + "\x00" + e.Func
}

// onPath returns the calls of round that keep accepts, with the returns of
// those calls, in order.
func onPath(round []pathtrace.Event, keep func(pathtrace.Event) bool) []pathtrace.Event {
	var out []pathtrace.Event
	open := map[int64][]bool{} // per goroutine, whether each open call is kept
	for _, e := range round {
		st := open[e.G]
		if e.Return {
			if len(st) == 0 {
				continue
			}
			if st[len(st)-1] {
				out = append(out, e)
			}
			open[e.G] = st[:len(st)-1]
			continue
		}
		k := keep(e)
		open[e.G] = append(st, k)
		if k {
			out = append(out, e)
		}
	}
	return out
}

// entries follows the reader through events, a round's calls on the path
// and their returns, and returns each entry into a file, in order.
//
// A call enters its file when its caller (the nearest frame of the module
// above it) is in another file. The first call on a goroutine that has no
// call of the round open is where the message crossed goroutines: on a
// goroutine the path started (Spawned), the caller is the function that
// started it; on one that waited for the message (a loop blocked on a
// channel), the reader first goes to that waiting function's file, unless
// they are in it already. Where the reader is follows the files of the
// runtime only: a helper's call, on whichever goroutine, leaves them where
// they were.
func entries(events []pathtrace.Event) []entry {
	type frame struct{ file, from string }
	stacks := map[int64][]frame{}
	var out []entry
	pos := "" // the file of the runtime the reader is in
	for _, e := range events {
		st := stacks[e.G]
		if e.Return {
			if len(st) > 0 {
				if from := st[len(st)-1].from; stationOf(from) {
					pos = from
				}
				stacks[e.G] = st[:len(st)-1]
			}
			continue
		}
		from := e.CallerFile
		if len(st) == 0 && !e.Spawned && from != "" && from != pos {
			// A goroutine that waited for the message: the reader goes
			// to its waiting function first.
			out = append(out, entry{File: from, Func: e.CallerFunc, Waiting: true})
			if stationOf(from) {
				pos = from
			}
		}
		if e.File != from {
			out = append(out, entry{File: e.File, Func: e.Func, From: from, FromFunc: e.CallerFunc})
		}
		stacks[e.G] = append(st, frame{e.File, from})
		if stationOf(e.File) {
			pos = e.File
		}
	}
	return out
}

// countEntries counts the entries per file.
func countEntries(entries []entry) map[string]int {
	n := map[string]int{}
	for _, e := range entries {
		n[e.File]++
	}
	return n
}

// stations are the path's entries into files of the runtime, in order.
func (p *sourcePath) stations() []entry { return stations(p.entries) }

// stations are the entries into files of the runtime, in order.
func stations(entries []entry) []entry {
	var out []entry
	for _, e := range entries {
		if stationOf(e.File) {
			out = append(out, e)
		}
	}
	return out
}

// check returns what breaks the limits: a file of the runtime entered more
// than maxEntries times, more than maxFiles such files (0: no limit).
func (p *sourcePath) check(maxEntries, maxFiles int) []string {
	var out []string
	files := 0
	for _, file := range slices.Sorted(maps.Keys(p.most)) {
		if !stationOf(file) {
			continue
		}
		files++
		if n := p.most[file]; maxEntries > 0 && n > maxEntries {
			out = append(out, fmt.Sprintf("%s: %s is entered %d times, more than %d", p.name, file, n, maxEntries))
		}
	}
	if maxFiles > 0 && files > maxFiles {
		out = append(out, fmt.Sprintf("%s: the path runs through %d files of the runtime, more than %d", p.name, files, maxFiles))
	}
	return out
}

// print writes the path: its numbered entries into files of the runtime,
// the entries per file, and the helpers.
func (p *sourcePath) print(w io.Writer) {
	fmt.Fprintf(w, "%s (%d rounds, each entering these files in this order)\n", p.name, p.rounds)
	for i, e := range p.stations() {
		fmt.Fprintf(w, "  %2d. %-34s %s\n", i+1, e.File, e.describe())
	}
	var stations, helpers []string
	for _, file := range slices.Sorted(maps.Keys(p.most)) {
		s := fmt.Sprintf("%s %d", file, p.most[file])
		if stationOf(file) {
			stations = append(stations, s)
		} else {
			helpers = append(helpers, s)
		}
	}
	fmt.Fprintf(w, "  entries per file of the runtime (%d files): %s\n", len(stations), strings.Join(stations, ", "))
	fmt.Fprintf(w, "  helpers, not counted (%d files): %s\n", len(helpers), strings.Join(helpers, ", "))
}

// describe says which function the entry calls, and from where.
func (e entry) describe() string {
	switch {
	case e.Waiting:
		return fmt.Sprintf("%s, waiting for the message", e.Func)
	case e.From == "":
		return fmt.Sprintf("%s, from a goroutine of a dependency", e.Func)
	default:
		return fmt.Sprintf("%s, from %s (%s)", e.Func, e.FromFunc, e.From)
	}
}

// report prints the paths, writes them to o.golden, and checks them
// against the limits and the numbered paths of o.doc.
func report(rec *traceFile, o options, root string) error {
	var paths []*sourcePath
	for _, src := range []struct {
		name string
		rec  recording
	}{{queuePath, rec.Queue}, {streamPath, rec.Stream}} {
		p, err := analyze(src.name, src.rec)
		if err != nil {
			return err
		}
		paths = append(paths, p)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "One new message on its success path, from its source to its count in Stats: the calls recorded\n")
	fmt.Fprintf(&sb, "in every message round and in no control round (go run ./bench/path; see its doc).\n")
	for _, p := range paths {
		fmt.Fprintln(&sb)
		p.print(&sb)
	}
	fmt.Print(sb.String())
	if o.golden != "" {
		if err := os.WriteFile(under(root, o.golden), []byte(sb.String()), 0o644); err != nil {
			return err
		}
	}
	var problems []string
	for _, p := range paths {
		problems = append(problems, p.check(o.maxEntries, o.maxFiles)...)
	}
	if o.doc != "" {
		doc, err := os.Open(under(root, o.doc))
		if err != nil {
			return err
		}
		defer doc.Close()
		documented, err := numberedPaths(doc)
		if err != nil {
			return fmt.Errorf("%s: %w", o.doc, err)
		}
		for _, p := range paths {
			measured := files(p.stations())
			if !slices.Equal(documented[p.name], measured) {
				problems = append(problems, fmt.Sprintf("%s: %s numbers %v, the path enters %v", p.name, o.doc, documented[p.name], measured))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// under is file, relative to root unless it is absolute.
func under(root, file string) string {
	if filepath.IsAbs(file) {
		return file
	}
	return filepath.Join(root, file)
}

// files lists the files of entries, in order.
func files(entries []entry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.File
	}
	return out
}

// The names of the paths, in the report and as the doc's headings say
// them ("# The path of a queue message").
const (
	queuePath  = "queue message"
	streamPath = "stream record"
)

var (
	// heading starts a numbered path: "# The path of a queue message" in
	// the doc, "queue message (…)" in the report.
	heading = regexp.MustCompile(`^(?://\s*# The path of an? |)(` + queuePath + `|` + streamPath + `)\b`)
	// item is one numbered entry: "1. consumer/source.go: …" in the doc,
	// "   1. consumer/source.go   router.loop, …" in the report.
	item = regexp.MustCompile(`^(?://)?\s*(\d+)\.\s+([\w./-]+\.go)\b`)
)

// numberedPaths reads the numbered paths of r, a Go file whose package doc
// has a "# The path of a queue message" and a "# The path of a stream
// record" section, or a report of this command: for each path, the files
// of its numbered entries, in order.
func numberedPaths(r io.Reader) (map[string][]string, error) {
	out := map[string][]string{}
	current := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if m := heading.FindStringSubmatch(line); m != nil {
			current = m[1]
			continue
		}
		if strings.HasPrefix(line, "// #") {
			current = "" // another section of the doc
		}
		if m := item.FindStringSubmatch(line); m != nil && current != "" {
			n, _ := strconv.Atoi(m[1])
			if n != len(out[current])+1 {
				return nil, fmt.Errorf("%s: entry %d follows entry %d", current, n, len(out[current]))
			}
			out[current] = append(out[current], m[2])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, name := range []string{queuePath, streamPath} {
		if len(out[name]) == 0 {
			return nil, fmt.Errorf("no numbered path of a %s", name)
		}
	}
	return out, nil
}
