package prommetrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	// tableSeries is the Prometheus column of a row of the metric table.
	tableSeries = regexp.MustCompile("(?m)^\\| `[a-z._]+` \\| `([a-z_]+)` \\|")
	// byClause and matcher are the parts of an expression that hold label
	// names and values rather than series names.
	byClause = regexp.MustCompile(`\b(by|without)\s*\([^)]*\)`)
	matcher  = regexp.MustCompile(`\{[^}]*\}`)
	series   = regexp.MustCompile(`\b(?:idem|http_server|messaging)_[a-z_]+`)
)

func TestDashboardReadsOnlySeriesTheGuideLists(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile("../docs/observability.md")
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, m := range tableSeries.FindAllStringSubmatch(string(guide), -1) {
		listed[m[1]] = true
	}
	require.Contains(t, listed, "idem_consumer_messages_total", "the metric table of docs/observability.md")

	raw, err := os.ReadFile("../docs/grafana/idem.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	ids := map[int]bool{}
	used := 0
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		for _, tg := range p.Targets {
			require.Equal(t, "${datasource}", tg.Datasource.UID, "panel %q", p.Title)
			expr := matcher.ReplaceAllString(byClause.ReplaceAllString(tg.Expr, ""), "")
			names := series.FindAllString(expr, -1)
			require.NotEmpty(t, names, "panel %q reads no idem series: %s", p.Title, tg.Expr)
			for _, n := range names {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(n, suffix); ok && listed[base] {
						n = base
					}
				}
				require.True(t, listed[n], "panel %q reads %s, which the table in docs/observability.md does not list", p.Title, n)
				used++
			}
		}
	}
	require.Greater(t, used, 20)
}
