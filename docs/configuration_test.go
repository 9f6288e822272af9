package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// configs are the structs docs/configuration.md documents, by package
// directory and type name.
var configs = []struct{ dir, pkg, typ string }{
	{"consumer", "consumer", "Config"},
	{"inbox", "inbox", "Config"},
	{"inbox", "inbox", "CleanupOptions"},
	{"inbox/httpinbox", "httpinbox", "Config"},
	{"inbox/httpinbox", "httpinbox", "Route"},
	{"inbox/httpinbox", "httpinbox", "Webhook"},
	{"inbox/httpinbox", "httpinbox", "Bulk"},
	{"ledger", "ledger", "Config"},
	{"ledger", "ledger", "DispatcherConfig"},
	{"ledger", "ledger", "HTTPExecutor"},
	{"ledger", "ledger", "AMQPConfig"},
	{"retention", "retention", "Config"},
	{"deadletters", "deadletters", "RedriveOptions"},
	{".", "idem", "Tables"},
}

// structFields returns the exported fields of the struct typ declared in
// the non-test files of dir.
func structFields(t *testing.T, dir, typ string) []string {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(filepath.Join(root, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var fields []string
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != typ {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, fld := range st.Fields.List {
				for _, name := range fld.Names {
					if name.IsExported() {
						fields = append(fields, name.Name)
					}
				}
			}
			return false
		})
		if fields != nil {
			return fields
		}
	}
	t.Fatalf("no struct %s in %s", typ, dir)
	return nil
}

// section returns the lines of md under the heading that names title, up
// to the next heading of the same or a higher level.
func section(md *markdown, title string) []string {
	start, level := -1, 0
	for i, line := range md.lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil || !isProse(md, i+1) {
			continue
		}
		if start >= 0 && len(m[1]) <= level {
			return md.lines[start:i]
		}
		if start < 0 && strings.Contains(m[2], title) {
			start, level = i+1, len(m[1])
		}
	}
	if start < 0 {
		return nil
	}
	return md.lines[start:]
}

func isProse(md *markdown, line int) bool {
	for _, p := range md.prose {
		if p.line == line {
			return true
		}
	}
	return false
}

var tableFieldRE = regexp.MustCompile("^\\|\\s*`([A-Z][A-Za-z0-9]*)`")

// The configuration reference and the code agree: every field of every
// documented struct has a row, and every row is a field that exists.
func TestConfigurationGuideListsEveryField(t *testing.T) {
	md := readMarkdown(t, "docs/configuration.md")
	for _, c := range configs {
		title := "`" + c.pkg + "." + c.typ + "`"
		lines := section(md, title)
		if lines == nil {
			t.Errorf("docs/configuration.md has no section titled %s", title)
			continue
		}
		rows := map[string]bool{}
		for _, line := range lines {
			if m := tableFieldRE.FindStringSubmatch(line); m != nil {
				rows[m[1]] = true
			}
		}
		fields := structFields(t, c.dir, c.typ)
		exists := map[string]bool{}
		for _, f := range fields {
			exists[f] = true
			if !rows[f] {
				t.Errorf("docs/configuration.md, section %s: no row for the field %s", title, f)
			}
		}
		for r := range rows {
			if !exists[r] {
				t.Errorf("docs/configuration.md, section %s: a row for %s, which %s.%s does not have", title, r, c.pkg, c.typ)
			}
		}
	}
}
