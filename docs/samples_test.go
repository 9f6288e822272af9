package docs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// corpus is the module's compiled Go code, normalised line by line, to find
// documentation samples in.
type corpus struct {
	files []goFile // src holds the normalised text
}

func newCorpus(t *testing.T) *corpus {
	c := &corpus{}
	for _, f := range goFiles(t) {
		c.files = append(c.files, goFile{f.path, "\n" + strings.Join(normalize(f.src), "\n") + "\n"})
	}
	return c
}

// normalize drops blank lines and indentation and collapses runs of spaces,
// so that gofmt's alignment and a sample's indentation do not matter.
func normalize(src string) []string {
	var out []string
	for _, line := range strings.Split(src, "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// find returns the file that holds sample's lines in a row, or "".
func (c *corpus) find(sample string) string {
	lines := normalize(sample)
	if len(lines) == 0 {
		return "(empty)"
	}
	needle := "\n" + strings.Join(lines, "\n") + "\n"
	for _, f := range c.files {
		if strings.Contains(f.src, needle) {
			return f.path
		}
	}
	return ""
}

// Every Go sample in the guides compiles. A sample that is a whole program
// (it starts with a package clause) is vetted as a package of its own; any
// other sample must appear, line for line, in a Go file the go command
// builds — an example, or docs/snippets_test.go — where it compiles
// against the real API.
func TestGoSamplesInTheGuidesCompile(t *testing.T) {
	corpus := newCorpus(t)
	programs := 0
	for _, md := range guides(t) {
		for _, b := range md.blocks {
			if b.lang != "go" {
				continue
			}
			if strings.HasPrefix(strings.TrimSpace(b.text), "package ") {
				programs++
				vetProgram(t, md.path, b)
				continue
			}
			if corpus.find(b.text) == "" {
				t.Errorf("%s:%d: this Go sample appears in no compiled Go file (put it, line for line, in an example or docs/snippets_test.go):\n%s",
					md.path, b.line, b.text)
			}
		}
	}
	if programs == 0 {
		t.Error("no whole program among the samples: the README's worker should be one")
	}
}

// vetProgram writes a whole-program sample into a package under testdata
// (which ./... leaves out) and runs go vet on it.
func vetProgram(t *testing.T, path string, b block) {
	t.Helper()
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("testdata", "sample")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(b.text+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goCmd, "vet", "./"+filepath.ToSlash(dir))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s:%d: this program does not compile or vet: %v\n%s", path, b.line, err, out)
	}
}
