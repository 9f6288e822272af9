package prommetrics_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// alertRules returns the expression of each alert of the rules file, by
// name; the file is plain Prometheus YAML, read line by line here.
func alertRules(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]string{}
	var name string
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if a, ok := strings.CutPrefix(l, "- alert: "); ok {
			name = a
			continue
		}
		expr, ok := strings.CutPrefix(l, "expr: ")
		if !ok {
			continue
		}
		if expr == "|" { // a block: the lines indented deeper than "expr:"
			indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
			expr = ""
			for i+1 < len(lines) && len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent {
				i++
				expr += lines[i] + "\n"
			}
		}
		require.NotEmpty(t, name, "an expr before any alert")
		out[name] = expr
	}
	return out
}

func TestAlertRulesReadOnlySeriesTheGuideListsAndHaveARunbook(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile("../docs/observability.md")
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, m := range tableSeries.FindAllStringSubmatch(string(guide), -1) {
		listed[m[1]] = true
	}
	operations, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)

	rules := alertRules(t, "../docs/prometheus/idem-alerts.yml")
	require.GreaterOrEqual(t, len(rules), 13)
	for name, expr := range rules {
		names := series.FindAllString(matcher.ReplaceAllString(byClause.ReplaceAllString(expr, ""), ""), -1)
		require.NotEmpty(t, names, "%s reads no idem series: %s", name, expr)
		for _, n := range names {
			require.True(t, listed[n], "%s reads %s, which the table in docs/observability.md does not list", name, n)
		}
		require.Regexp(t, regexp.MustCompile(`(?m)^### `+name+`$`), string(operations),
			"docs/operations.md has a runbook paragraph for %s", name)
	}
}
