package docs_test

import (
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goFile is one Go source file of the module.
type goFile struct {
	path string // relative to the module root
	src  string
}

// goFiles returns every Go file that the go command compiles: tests
// included, testdata and files that opt out with a build constraint left
// out.
func goFiles(t *testing.T) []goFile {
	t.Helper()
	var files []goFile
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if regexp.MustCompile(`(?m)^//go:build ignore$`).Match(src) {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		files = append(files, goFile{filepath.ToSlash(rel), string(src)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// pkgDoc is the documentation of one public package.
type pkgDoc struct {
	dir      string // relative to the module root; "." for package idem
	docFiles []string
	doc      string // the package comment's text
}

// publicPackages returns the module's library packages: what users import.
// Commands, examples, benchmarks, internal packages and tests are not.
func publicPackages(t *testing.T) []pkgDoc {
	t.Helper()
	byDir := map[string]*pkgDoc{}
	var order []string
	fset := token.NewFileSet()
	for _, f := range goFiles(t) {
		dir := filepath.ToSlash(filepath.Dir(f.path))
		if strings.HasSuffix(f.path, "_test.go") || !isPublicDir(dir) {
			continue
		}
		file, err := parser.ParseFile(fset, f.path, f.src, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if file.Name.Name == "main" {
			continue
		}
		p, ok := byDir[dir]
		if !ok {
			p = &pkgDoc{dir: dir}
			byDir[dir] = p
			order = append(order, dir)
		}
		if file.Doc != nil {
			p.docFiles = append(p.docFiles, f.path)
			p.doc += file.Doc.Text()
		}
	}
	var out []pkgDoc
	for _, dir := range order {
		out = append(out, *byDir[dir])
	}
	return out
}

func isPublicDir(dir string) bool {
	for _, part := range strings.Split(dir, "/") {
		switch part {
		case "internal", "examples", "bench", "cmd", "docs", "testdata", "scripts":
			return false
		}
	}
	return true
}

// A package's godoc is where its users start: a tutorial in doc.go, at
// least 25 lines, with headings to navigate it.
func TestEveryPublicPackageHasATutorial(t *testing.T) {
	pkgs := publicPackages(t)
	if len(pkgs) < 12 {
		t.Fatalf("found %d public packages; the walk is broken", len(pkgs))
	}
	for _, p := range pkgs {
		want := filepath.ToSlash(filepath.Join(p.dir, "doc.go"))
		if len(p.docFiles) != 1 || p.docFiles[0] != want {
			t.Errorf("package %s: its package comment belongs in %s alone, found it in %v", p.dir, want, p.docFiles)
		}
		lines := strings.Count(p.doc, "\n")
		if lines < 25 {
			t.Errorf("package %s: its tutorial has %d lines; write at least 25", p.dir, lines)
		}
		if !regexp.MustCompile(`(?m)^# \S`).MatchString(p.doc) {
			t.Errorf("package %s: its tutorial has no # Heading", p.dir)
		}
	}
}

// Code in a package comment is Go that compiles: every block that parses as
// Go appears, line for line, in a Go file the go command builds (an
// example, usually), so it cannot drift from the API.
func TestGodocSamplesAppearInCompiledCode(t *testing.T) {
	corpus := newCorpus(t)
	for _, p := range publicPackages(t) {
		var parser comment.Parser
		for _, b := range parser.Parse(p.doc).Content {
			code, ok := b.(*comment.Code)
			if !ok || !parsesAsGo(code.Text) {
				continue
			}
			if where := corpus.find(code.Text); where == "" {
				t.Errorf("package %s: this sample appears in no compiled Go file:\n%s", p.dir, code.Text)
			}
		}
	}
}

// parsesAsGo reports whether src is Go declarations or statements.
func parsesAsGo(src string) bool {
	fset := token.NewFileSet()
	if _, err := parser.ParseFile(fset, "", "package p\n"+src, 0); err == nil {
		return true
	}
	f, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+src+"\n}", 0)
	if err != nil {
		return false
	}
	// A lone word or a label is prose or YAML, not a sample.
	body := f.Decls[0].(*ast.FuncDecl).Body.List
	for _, s := range body {
		if _, ok := s.(*ast.LabeledStmt); ok {
			return false
		}
	}
	return len(body) > 0
}
