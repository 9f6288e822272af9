package main

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// tracePkg is the recorder the instrumented functions call.
const tracePkg = "github.com/idemkit/idem/bench/path/pathtrace"

// traceName is the name the instrumented files import tracePkg under: no
// file of the module declares it.
const traceName = "idempathtrace"

// buildTraced writes an instrumented copy of every library file of the
// module rooted at root under dir, and builds this command from them with
// go build -overlay: the module's tree is left as it is. It returns the
// binary's path.
func buildTraced(ctx context.Context, goCmd, root, dir string) (string, error) {
	files, err := libraryFiles(root)
	if err != nil {
		return "", err
	}
	replace := map[string]string{}
	for _, rel := range files {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", err
		}
		out, err := instrument(rel, src)
		if err != nil {
			return "", err
		}
		if out == nil {
			continue // no function to record
		}
		copyPath := filepath.Join(dir, "src", filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(copyPath), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(copyPath, out, 0o644); err != nil {
			return "", err
		}
		replace[filepath.Join(root, filepath.FromSlash(rel))] = copyPath
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", err
	}
	overlayPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "path-traced")
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, goCmd, "build", "-overlay", overlayPath, "-o", bin, "./bench/path")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the instrumented command: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// libraryFiles lists the module's library files (see library), relative
// to root, slash-separated.
func libraryFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if library(rel) {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// library reports whether file (relative to the module root) is library
// code: not a test, and not under bench/, examples/, cmd/ or the test kit.
// internal/streamclient is not either: it is a copy of a third party's
// stream client (see its doc.go), counted no more than the client itself
// was before it was copied, and its files are not the house's to split.
func library(file string) bool {
	top, _, _ := strings.Cut(file, "/")
	return strings.HasSuffix(file, ".go") && !strings.HasSuffix(file, "_test.go") &&
		top != "bench" && top != "examples" && top != "cmd" && !strings.HasPrefix(file, "internal/testkit/") &&
		!strings.HasPrefix(file, "internal/streamclient/")
}

// instrument returns src, the file rel, with a call of the recorder at the
// top of each function and function literal, and the recorder's import;
// nil when the file has no function. Each insertion stays on the line of
// the brace it follows, so that every line keeps its number.
func instrument(rel string, src []byte) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	type insertion struct {
		at   int
		text string
	}
	var ins []insertion
	enter := func(body *ast.BlockStmt, name string) {
		ins = append(ins, insertion{fset.Position(body.Lbrace).Offset + 1,
			fmt.Sprintf("defer %s.Enter(%s, %s)();", traceName, strconv.Quote(rel), strconv.Quote(name))})
	}
	funcNames(f, enter)
	if len(ins) == 0 {
		return nil, nil
	}
	ins = append(ins, insertion{fset.Position(f.Name.End()).Offset,
		fmt.Sprintf("; import %s %s", traceName, strconv.Quote(tracePkg))})
	slices.SortFunc(ins, func(a, b insertion) int { return b.at - a.at }) // from the end: offsets stay valid
	out := slices.Clone(src)
	for _, in := range ins {
		out = slices.Insert(out, in.at, []byte(in.text)...)
	}
	return out, nil
}

// funcNames calls visit with the body and name of each function and
// function literal of f that has a body: Func, Recv.Method, Outer.funcN
// for the Nth literal in Outer (counting nested ones), glob.funcN outside
// functions.
func funcNames(f *ast.File, visit func(body *ast.BlockStmt, name string)) {
	globs := 0
	for _, d := range f.Decls {
		outer, lits := "glob", &globs
		if fd, ok := d.(*ast.FuncDecl); ok {
			outer, lits = fd.Name.Name, new(int)
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				outer = receiver(fd.Recv.List[0].Type) + "." + outer
			}
			if fd.Body != nil {
				visit(fd.Body, outer)
			}
		}
		ast.Inspect(d, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok {
				*lits++
				visit(fl.Body, fmt.Sprintf("%s.func%d", outer, *lits))
			}
			return true
		})
	}
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
