package docs_test

import (
	"regexp"
	"strings"
	"testing"
)

// historyRE matches how development history is written: a numbered
// session, issue, stop, pull request or milestone ("Session 2", "issue 14",
// "issue #7", "PR #31"). A word on its own ("a broker session", "a known
// issue") is not history.
var historyRE = regexp.MustCompile(`(?i)\b(sessions?|issues?|stops?|pull requests?|PRs?|milestones?)\s+#?\d+\b|\b(issue|PR)\s*#`)

// Docs describe the project as it is; how it got there lives in git.
func TestDocsHaveNoDevelopmentHistory(t *testing.T) {
	for _, md := range guides(t) {
		for i, line := range md.lines {
			if m := historyRE.FindString(line); m != "" {
				t.Errorf("%s:%d: development history %q in %q", md.path, i+1, m, strings.TrimSpace(line))
			}
		}
	}
	for _, p := range publicPackages(t) {
		for _, line := range strings.Split(p.doc, "\n") {
			if m := historyRE.FindString(line); m != "" {
				t.Errorf("package %s: development history %q in %q", p.dir, m, strings.TrimSpace(line))
			}
		}
	}
}

func TestHistoryPatternTellsHistoryFromPlainWords(t *testing.T) {
	for _, s := range []string{"Session 2: final runs", "as issue 14 asked", "see issue #7", "stop 3 ended", "PR #31", "sessions 1 and 2"} {
		if !historyRE.MatchString(s) {
			t.Errorf("%q is history and was not caught", s)
		}
	}
	for _, s := range []string{"a dead broker session cancels its handlers", "session-level advisory lock",
		"sessions terminated → processed", "a known issue", "stops reading at 64 MiB", "the issue: 3 workers"} {
		if historyRE.MatchString(s) {
			t.Errorf("%q is not history and was caught", s)
		}
	}
}

// testNameRE matches a test named in a guide, such as
// `TestCrashBetweenCommitAndAckRedeliversAsDuplicate`.
var testNameRE = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*)`")

// A guarantee names the test that defends it; the name must be a test that
// runs, not one that was renamed or deleted.
func TestTestsNamedInTheDocsExist(t *testing.T) {
	defined := map[string]bool{}
	for _, f := range goFiles(t) {
		for _, m := range regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`).FindAllStringSubmatch(f.src, -1) {
			defined[m[1]] = true
		}
	}
	for _, md := range guides(t) {
		for i, line := range md.lines {
			for _, m := range testNameRE.FindAllStringSubmatch(line, -1) {
				if !defined[m[1]] {
					t.Errorf("%s:%d: names %s, which no test file defines", md.path, i+1, m[1])
				}
			}
		}
	}
}
