package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// libraryFiles are the module's non-test Go files outside examples, bench
// and the soak harness: the code users link or run as the operator CLI.
func libraryFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "examples" || path == "bench" || path == "internal/soak" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A function reads top to bottom in one screen; over 100 lines is a design
// smell, split by stage.
func TestNoLibraryFunctionIsLongerThan100Lines(t *testing.T) {
	fset := token.NewFileSet()
	for _, path := range libraryFiles(t) {
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines > 100 {
				t.Errorf("%s: %s is %d lines long", fset.Position(fn.Pos()), fn.Name.Name, lines)
			}
		}
	}
}

// consumer is the public face of the runtime: small enough to read in one
// screen of go doc. Internals live in internal/engine and the sources.
func TestConsumerExportsAtMost45Names(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, "consumer", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, decl := range f.Decls {
				names = append(names, exported(decl)...)
			}
		}
	}
	if len(names) > 45 {
		t.Errorf("consumer exports %d names (at most 45): %v", len(names), names)
	}
	for _, internal := range []string{"BatchOptions", "ProcessWith", "IsBatchError", "AdvanceCheckpoint", "MoveCheckpoint",
		"StreamLockKey", "ListDeadLetters"} {
		for _, n := range names {
			if n == internal || strings.HasSuffix(n, "."+internal) {
				t.Errorf("consumer exports %s, which only the module's own packages need", internal)
			}
		}
	}
}

// exported lists the exported names a declaration adds to its package:
// functions, methods (as Type.Method), types, constants and variables.
func exported(decl ast.Decl) []string {
	var out []string
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return nil
		}
		if d.Recv != nil && len(d.Recv.List) > 0 {
			return []string{receiverName(d.Recv.List[0].Type) + "." + d.Name.Name}
		}
		return []string{d.Name.Name}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() {
					out = append(out, s.Name.Name)
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						out = append(out, n.Name)
					}
				}
			}
		}
	}
	return out
}

func receiverName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return receiverName(t.X)
	}
	return "?"
}
