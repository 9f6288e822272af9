package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stationPackages are the runtime packages whose files count as stations of
// a message's path, in the order the count names them. Every other library
// file on the path is a helper.
var stationPackages = []string{"consumer", "internal/engine", "inbox"}

// block is one coverage block, named by its file (slash-separated, relative
// to the module root) and where it starts: no two blocks start at the same
// place.
type block struct {
	file      string
	line, col int
}

// blockSet is a set of coverage blocks.
type blockSet map[block]struct{}

// fileRun is one library file on the path: how many of its blocks the
// message ran, and in which functions (in source order).
type fileRun struct {
	file    string
	station string // its station package, "" for a helper
	blocks  int
	funcs   []string
}

// messagePath is the measured path of one message.
type messagePath struct {
	files     []fileRun // sorted by file
	rounds    int       // message rounds, and as many control rounds
	identical bool      // every message round hit the same blocks
}

// trace converts the snapshots with go tool covdata and returns the path:
// the library blocks hit in every message round and in no control round.
func trace(ctx context.Context, goCmd string, s snapshots) (*messagePath, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Main.Path == "" {
		return nil, errors.New("no module path in the binary's build info")
	}
	mod := info.Main.Path
	read := func(dirs []string) ([]blockSet, error) {
		var sets []blockSet
		for _, dir := range dirs {
			hit, err := profile(ctx, goCmd, dir, mod)
			if err != nil {
				return nil, err
			}
			sets = append(sets, hit)
		}
		return sets, nil
	}
	messages, err := read(s.messages)
	if err != nil {
		return nil, err
	}
	controls, err := read(s.controls)
	if err != nil {
		return nil, err
	}
	files, err := byFile(onPath(messages, controls))
	if err != nil {
		return nil, err
	}
	return &messagePath{files: files, rounds: len(messages), identical: len(intersect(messages)) == len(union(messages))}, nil
}

// profile converts the counter snapshot in dir to a text profile (go tool
// covdata textfmt, written beside it) and returns the library blocks of
// module mod it hit.
func profile(ctx context.Context, goCmd, dir, mod string) (blockSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	txt := dir + ".txt"
	cmd := exec.CommandContext(ctx, goCmd, "tool", "covdata", "textfmt", "-i="+dir, "-o="+txt)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool covdata textfmt -i=%s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	f, err := os.Open(txt)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	defer f.Close()
	hit, instrumented, err := parseProfile(f, mod)
	if err != nil {
		return nil, fmt.Errorf("read profile %s: %w", txt, err)
	}
	if instrumented == 0 {
		return nil, fmt.Errorf("profile %s has no block of %s's library (%s)", txt, mod, buildHint)
	}
	return hit, nil
}

// parseProfile reads a text profile and returns the library blocks of
// module mod with a count above zero, and how many library blocks it holds
// (zero when the binary was built without -coverpkg).
func parseProfile(r io.Reader, mod string) (hit blockSet, instrumented int, err error) {
	hit = blockSet{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// github.com/idemkit/idem/inbox/claim.go:235.60,240.16 3 1
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || strings.HasPrefix(fields[0], "mode:") {
			continue
		}
		name, span, ok := strings.Cut(fields[0], ":")
		file, inModule := strings.CutPrefix(name, mod+"/")
		if !ok || !inModule || !library(file) {
			continue
		}
		instrumented++
		if n, err := strconv.ParseInt(fields[2], 10, 64); err != nil || n == 0 {
			continue
		}
		start, _, _ := strings.Cut(span, ",")
		line, col, _ := strings.Cut(start, ".")
		b := block{file: file}
		if b.line, err = strconv.Atoi(line); err != nil {
			return nil, 0, fmt.Errorf("block %s: %w", fields[0], err)
		}
		if b.col, err = strconv.Atoi(col); err != nil {
			return nil, 0, fmt.Errorf("block %s: %w", fields[0], err)
		}
		hit[b] = struct{}{}
	}
	return hit, instrumented, sc.Err()
}

// library reports whether file (relative to the module root) is library
// code: not a test, and not under bench/, examples/ or cmd/.
func library(file string) bool {
	top, _, _ := strings.Cut(file, "/")
	return strings.HasSuffix(file, ".go") && !strings.HasSuffix(file, "_test.go") &&
		top != "bench" && top != "examples" && top != "cmd"
}

// stationOf returns the station package of file, or "" when file is a
// helper.
func stationOf(file string) string {
	if dir := path.Dir(file); slices.Contains(stationPackages, dir) {
		return dir
	}
	return ""
}

// onPath returns the blocks hit in every message round and in no control
// round.
func onPath(messages, controls []blockSet) blockSet {
	background := union(controls)
	on := blockSet{}
	for b := range intersect(messages) {
		if _, ok := background[b]; !ok {
			on[b] = struct{}{}
		}
	}
	return on
}

// intersect returns the blocks in every set.
func intersect(sets []blockSet) blockSet {
	out := blockSet{}
	if len(sets) == 0 {
		return out
	}
next:
	for b := range sets[0] {
		for _, s := range sets[1:] {
			if _, ok := s[b]; !ok {
				continue next
			}
		}
		out[b] = struct{}{}
	}
	return out
}

// union returns the blocks in any set.
func union(sets []blockSet) blockSet {
	out := blockSet{}
	for _, s := range sets {
		for b := range s {
			out[b] = struct{}{}
		}
	}
	return out
}

// byFile groups blocks by file and names their functions from the sources,
// which it reads relative to the working directory (the module root).
func byFile(blocks blockSet) ([]fileRun, error) {
	perFile := map[string][]block{}
	for b := range blocks {
		perFile[b.file] = append(perFile[b.file], b)
	}
	var runs []fileRun
	for file, bs := range perFile {
		spans, err := functions(filepath.FromSlash(file))
		if err != nil {
			return nil, fmt.Errorf("name the functions of %s (run from the module root): %w", file, err)
		}
		slices.SortFunc(bs, func(a, b block) int { return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.col, b.col)) })
		run := fileRun{file: file, station: stationOf(file), blocks: len(bs)}
		for _, b := range bs {
			if name := funcAt(spans, b.line, b.col); !slices.Contains(run.funcs, name) {
				run.funcs = append(run.funcs, name)
			}
		}
		runs = append(runs, run)
	}
	slices.SortFunc(runs, func(a, b fileRun) int { return strings.Compare(a.file, b.file) })
	return runs, nil
}

// funcSpan is a function's name and extent in its file.
type funcSpan struct {
	name       string
	start, end token.Position
}

// functions lists the functions of a Go source file, declarations and
// literals, named as stack traces name them: Func, Recv.Method,
// Func.funcN for the Nth literal in Func, glob.funcN outside functions.
func functions(file string) ([]funcSpan, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var spans []funcSpan
	globs := 0
	for _, d := range f.Decls {
		outer, lits := "glob", &globs
		if fd, ok := d.(*ast.FuncDecl); ok {
			outer, lits = fd.Name.Name, new(int)
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				outer = receiver(fd.Recv.List[0].Type) + "." + outer
			}
			spans = append(spans, funcSpan{outer, fset.Position(fd.Pos()), fset.Position(fd.End())})
		}
		ast.Inspect(d, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok {
				*lits++
				spans = append(spans, funcSpan{fmt.Sprintf("%s.func%d", outer, *lits), fset.Position(fl.Pos()), fset.Position(fl.End())})
			}
			return true
		})
	}
	return spans, nil
}

// receiver is the type name of a method's receiver, without * or type
// parameters.
func receiver(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiver(t.X)
	case *ast.IndexExpr:
		return receiver(t.X)
	case *ast.IndexListExpr:
		return receiver(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// funcAt names the innermost function whose extent holds line:col.
func funcAt(spans []funcSpan, line, col int) string {
	name, size := "(outside functions)", -1
	for _, s := range spans {
		if before(line, col, s.start) || !before(line, col, s.end) {
			continue
		}
		if n := s.end.Offset - s.start.Offset; size < 0 || n < size {
			name, size = s.name, n
		}
	}
	return name
}

// before reports whether line:col comes before p.
func before(line, col int, p token.Position) bool {
	return line < p.Line || line == p.Line && col < p.Column
}

// stations is how many of the path's files are stations.
func (p *messagePath) stations() int {
	n := 0
	for _, f := range p.files {
		if f.station != "" {
			n++
		}
	}
	return n
}

// print writes the path: the stations, the helpers and the station count.
func (p *messagePath) print(w io.Writer) {
	fmt.Fprintf(w, "One new message, delivery -> handler -> commit -> ack -> counted: the library blocks hit in all %d message rounds\n", p.rounds)
	fmt.Fprintf(w, "and in none of the %d control rounds (the message rounds hit identical block sets: %v).\n", p.rounds, p.identical)
	perPackage := map[string]int{}
	var stations, helpers []fileRun
	for _, f := range p.files {
		if f.station == "" {
			helpers = append(helpers, f)
			continue
		}
		stations = append(stations, f)
		perPackage[f.station]++
	}
	fmt.Fprintf(w, "stations (files of %s):\n", strings.Join(stationPackages, ", "))
	printFiles(w, stations)
	fmt.Fprintf(w, "helpers (root package value types, leaf utilities; not counted):\n")
	printFiles(w, helpers)
	counts := make([]string, len(stationPackages))
	for i, pkg := range stationPackages {
		counts[i] = fmt.Sprintf("%s %d", pkg, perPackage[pkg])
	}
	fmt.Fprintf(w, "stations: %d (%s)\n", len(stations), strings.Join(counts, ", "))
	fmt.Fprintf(w, "helpers: %d\n", len(helpers))
}

// printFiles writes one line per file: its blocks and functions.
func printFiles(w io.Writer, files []fileRun) {
	if len(files) == 0 {
		fmt.Fprintf(w, "  (none)\n")
	}
	for _, f := range files {
		fmt.Fprintf(w, "  %-36s %3d blocks  %s\n", f.file, f.blocks, strings.Join(f.funcs, ", "))
	}
}
