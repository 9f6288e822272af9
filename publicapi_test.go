package idem_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The public packages are one door into the runtime: what go doc shows of
// them (a function's or a method's signature, an exported field, a type, a
// variable's or a constant's type) never names a type of an internal
// package, which a user could neither build nor rely on.
func TestGoDocOfPublicPackagesShowsNoInternalType(t *testing.T) {
	dirs := publicPackageDirs(t)
	if !slices.Contains(dirs, "consumer") || !slices.Contains(dirs, "replay") {
		t.Fatalf("the walk missed the public packages: %v", dirs)
	}
	for _, dir := range dirs {
		for _, leak := range internalTypesInDoc(t, dir) {
			t.Errorf("go doc ./%s: %s", dir, leak)
		}
	}
}

// publicPackageDirs are the directories of the module's library packages:
// every directory with non-test Go files but internal/, examples/, bench/,
// cmd/, testdata/ and hidden ones.
func publicPackageDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		switch name := d.Name(); {
		case path == ".":
		case strings.HasPrefix(name, "."), name == "testdata",
			slices.Contains([]string{"internal", "examples", "bench", "cmd"}, path):
			return filepath.SkipDir
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
				dirs = append(dirs, path)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// internalTypesInDoc describes each place where the documentation of the
// package in dir names a type of a package whose import path has an
// internal/ element.
func internalTypesInDoc(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") },
		parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var leaks []string
	for name, pkg := range pkgs {
		if name == "main" {
			continue
		}
		// Each file's import names, resolved to paths, before go/doc
		// filters the declarations down to what it shows.
		imports := map[string]map[string]string{}
		var files []*ast.File
		for path, f := range pkg.Files {
			imports[path] = importNames(f)
			files = append(files, f)
		}
		p, err := doc.NewFromFiles(fset, files, "github.com/idemkit/idem/"+filepath.ToSlash(dir))
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, node ast.Node) {
			names := imports[fset.Position(node.Pos()).Filename]
			for _, ref := range internalRefs(node, names) {
				leaks = append(leaks, what+" names "+ref)
			}
		}
		checkValues := func(vs []*doc.Value) {
			for _, v := range vs {
				for _, spec := range v.Decl.Specs {
					s := spec.(*ast.ValueSpec)
					what := strings.Join(identNames(s.Names), ", ")
					if s.Type != nil {
						check(what, s.Type)
					}
					for _, val := range s.Values { // T{…}, &T{…}, T(x): a value of type T
						ast.Inspect(val, func(n ast.Node) bool {
							if cl, ok := n.(*ast.CompositeLit); ok && cl.Type != nil {
								check(what, cl.Type)
							}
							return true
						})
					}
				}
			}
		}
		checkFuncs := func(fs []*doc.Func) {
			for _, f := range fs {
				what := f.Name
				if f.Recv != "" {
					what = "(" + f.Recv + ")." + f.Name
				}
				check(what, f.Decl.Type)
				if f.Decl.Recv != nil {
					check(what, f.Decl.Recv)
				}
			}
		}
		checkValues(p.Consts)
		checkValues(p.Vars)
		checkFuncs(p.Funcs)
		for _, typ := range p.Types {
			for _, spec := range typ.Decl.Specs {
				check("type "+typ.Name, spec.(*ast.TypeSpec).Type)
			}
			checkValues(typ.Consts)
			checkValues(typ.Vars)
			checkFuncs(typ.Funcs)
			checkFuncs(typ.Methods)
		}
	}
	slices.Sort(leaks)
	return leaks
}

// importNames maps the names f refers to its imports by to their paths.
func importNames(f *ast.File) map[string]string {
	names := map[string]string{}
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = path
	}
	return names
}

// internalRefs are the qualified identifiers (pkg.Name) in node whose
// package is internal, as pkg.Name (import path).
func internalRefs(node ast.Node, names map[string]string) []string {
	var out []string
	ast.Inspect(node, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok {
			if path, ok := names[x.Name]; ok && (strings.Contains(path, "/internal/") || strings.HasPrefix(path, "internal/")) {
				out = append(out, x.Name+"."+sel.Sel.Name+" ("+path+")")
			}
		}
		return false
	})
	return out
}

func identNames(ids []*ast.Ident) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Name
	}
	return out
}
