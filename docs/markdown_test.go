package docs_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the module root, seen from this package's directory.
const root = ".."

// markdown is what the doc checks know about one Markdown file.
type markdown struct {
	path     string          // relative to the module root
	lines    []string        // the file's lines
	anchors  map[string]bool // GitHub anchors of its headings
	links    []link          // links outside code
	blocks   []block         // fenced code blocks
	prose    []numberedLine  // lines outside fenced code blocks
	headings []numberedLine  // heading lines, without the leading #s
}

type link struct {
	line   int
	target string
}

type block struct {
	line int    // of the opening fence
	lang string // the info string's first word
	text string
}

type numberedLine struct {
	line int
	text string
}

// guides are the Markdown files the checks cover: the README, every file
// under docs/ and BENCHMARKS.md.
func guides(t *testing.T) []*markdown {
	t.Helper()
	paths := []string{"README.md", "BENCHMARKS.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var mds []*markdown
	for _, p := range paths {
		mds = append(mds, readMarkdown(t, p))
	}
	return mds
}

var (
	fenceRE      = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^\\s`]*)")
	headingRE    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	inlineCodeRE = regexp.MustCompile("`+[^`]*`+")
	linkRE       = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(\s|$)`)
)

func readMarkdown(t *testing.T, path string) *markdown {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	md := &markdown{path: path, anchors: map[string]bool{}}
	seen := map[string]int{}
	var fence string
	var cur *block
	var body []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		md.lines = append(md.lines, line)
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			if fence == "" {
				fence, cur, body = m[1][:3], &block{line: n, lang: m[2]}, nil
				continue
			}
			if strings.HasPrefix(m[1], fence) && strings.TrimSpace(line) == strings.TrimSpace(m[1]) {
				cur.text = strings.Join(body, "\n")
				md.blocks = append(md.blocks, *cur)
				fence, cur = "", nil
				continue
			}
		}
		if fence != "" {
			body = append(body, line)
			continue
		}
		md.prose = append(md.prose, numberedLine{n, line})
		if m := headingRE.FindStringSubmatch(line); m != nil {
			md.headings = append(md.headings, numberedLine{n, m[2]})
			a := anchor(m[2])
			if k := seen[a]; k > 0 {
				md.anchors[a+"-"+strconv.Itoa(k)] = true
			} else {
				md.anchors[a] = true
			}
			seen[a]++
		}
		plain := inlineCodeRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(plain, -1) {
			md.links = append(md.links, link{n, m[1]})
		}
		if m := refDefRE.FindStringSubmatch(plain); m != nil {
			md.links = append(md.links, link{n, m[1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if fence != "" {
		t.Errorf("%s:%d: code block never closed", path, cur.line)
	}
	return md
}

// anchor is the id GitHub gives a heading: its text in lower case, without
// link targets and punctuation, spaces turned into hyphens.
func anchor(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// A reader follows a link and lands where it says: the file exists, and
// the heading its #anchor names is there.
func TestRelativeLinksResolve(t *testing.T) {
	mds := guides(t)
	byPath := map[string]*markdown{}
	for _, md := range mds {
		byPath[md.path] = md
	}
	for _, md := range mds {
		for _, l := range md.links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(l.target, "#")
			target := md.path
			if file != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(md.path), file)))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: %s leaves the repository", md.path, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: %s: no such file or directory %s", md.path, l.line, l.target, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			dest, ok := byPath[target]
			if !ok && strings.HasSuffix(target, ".md") {
				dest = readMarkdown(t, target)
			}
			if dest == nil {
				t.Errorf("%s:%d: %s: anchors are checked only in Markdown files", md.path, l.line, l.target)
				continue
			}
			if !dest.anchors[frag] {
				t.Errorf("%s:%d: %s: %s has no heading with anchor #%s", md.path, l.line, l.target, target, frag)
			}
		}
	}
}

// BENCHMARKS.md holds current figures, each with its command and baseline:
// a page a reader can take in, not a record of every run.
func TestBenchmarksPageHoldsCurrentFiguresOnly(t *testing.T) {
	const limit = 25 << 10
	data, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > limit {
		t.Errorf("BENCHMARKS.md is %d bytes; current figures fit in %d", len(data), limit)
	}
}

// The README is a front page: short, and a way into every guide, each of
// which leads back to it and to the guide index.
func TestReadmeIsAFrontPageLinkedBothWaysWithEveryGuide(t *testing.T) {
	readme := readMarkdown(t, "README.md")
	if n := len(readme.lines); n > 400 {
		t.Errorf("README.md has %d lines; a front page has at most 400", n)
	}
	linksTo := func(md *markdown, target string) bool {
		for _, l := range md.links {
			file, _, _ := strings.Cut(l.target, "#")
			if file != "" && filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(md.path), file))) == target {
				return true
			}
		}
		return false
	}
	for _, md := range guides(t) {
		if !strings.HasPrefix(md.path, "docs/") {
			continue
		}
		if !linksTo(readme, md.path) {
			t.Errorf("README.md does not link to %s", md.path)
		}
		if !linksTo(md, "README.md") {
			t.Errorf("%s does not link back to the README", md.path)
		}
		if md.path != "docs/README.md" && !linksTo(md, "docs/README.md") {
			t.Errorf("%s does not link to the guide index docs/README.md", md.path)
		}
	}
}
