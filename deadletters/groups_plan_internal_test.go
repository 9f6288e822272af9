package deadletters

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// planNode is the part of an EXPLAIN (ANALYZE, FORMAT JSON) node the test
// reads.
type planNode struct {
	NodeType      string     `json:"Node Type"`
	IndexName     string     `json:"Index Name"`
	ActualRows    float64    `json:"Actual Rows"`
	ActualLoops   float64    `json:"Actual Loops"`
	RemovedFilter float64    `json:"Rows Removed by Filter"`
	Plans         []planNode `json:"Plans"`
}

// read sums the rows and index entries n's scans read, kept or filtered
// out, and lists the scans.
func (n planNode) read() (entries float64, scans []string) {
	if strings.Contains(n.NodeType, "Scan") && n.NodeType != "CTE Scan" && n.NodeType != "WorkTable Scan" {
		entries += (n.ActualRows + n.RemovedFilter) * n.ActualLoops
		scans = append(scans, strings.TrimSpace(n.NodeType+" "+n.IndexName))
	}
	for _, c := range n.Plans {
		e, s := c.read()
		entries += e
		scans = append(scans, s...)
	}
	return entries, scans
}

// Grouping a large table reads a few index entries per group: the groups'
// keys, the ends of their ranges, and at most CountCap entries each, not
// the table, whether PostgreSQL plans the statement for its arguments or
// once for all (a generic plan, which a cached statement gets after five
// executions).
func TestGroupsReadAFewEntriesPerGroupWhateverTheNumberOfDeadLetters(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	table := tables.Table("dead_letters")
	const rows = 200000
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
SELECT 'c' || (i % 4), i::text, sha256(i::text::bytea), (ARRAY['max_attempts', 'handler', 'payload_conflict'])[1 + i % 3],
	now() - i * interval '1 second'
FROM generate_series(1, $1::int) AS i`, rows)
	require.NoError(t, err)
	// Skewed groups: a burst of the last minutes, a few from long ago.
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, payload_hash, reason, dead_lettered_at)
SELECT 'c1', 'b' || i, sha256(i::text::bytea), CASE WHEN i <= 3 THEN 'ancient' ELSE 'burst' END,
	CASE WHEN i <= 3 THEN now() - interval '400 days' ELSE now() - i * interval '1 millisecond' END
FROM generate_series(1, 5000) AS i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	pooled, err := pool.Acquire(ctx)
	require.NoError(t, err)
	// The connection is taken from the pool and closed after: it keeps the
	// prepared statements and the plan cache mode the checks set.
	conn := pooled.Hijack()
	defer conn.Close(context.Background())
	// Fresh dead letters (no index-only scan saves a heap visit), then
	// vacuumed ones.
	groupsReadAFew(t, conn, tables, rows, "fresh")
	_, err = pool.Exec(ctx, `VACUUM `+table)
	require.NoError(t, err)
	groupsReadAFew(t, conn, tables, rows, "vacuumed")
}

// groupsReadAFew checks the plans of Groups' statements on conn.
func groupsReadAFew(t *testing.T, conn *pgx.Conn, tables idem.Tables, rows int, state string) {
	ctx := context.Background()
	for i, f := range []GroupFilter{{By: ByReason}, {By: ByConsumerReason}, {By: ByReason, Consumer: "c1"}} {
		const countCap, limit = 1000, 100
		stmt, args := groupsStatement(tables, f), []string{fmt.Sprint(countCap), fmt.Sprint(limit)}
		params := "int, int"
		if f.Consumer != "" {
			params, args = params+", text", append(args, "'"+f.Consumer+"'")
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("PREPARE groups_%s_%d (%s) AS %s", state, i, params, stmt))
		require.NoError(t, err)
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			_, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode)
			require.NoError(t, err)
			var out []struct{ Plan planNode }
			require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE groups_%s_%d (%s)", state, i,
				strings.Join(args, ", "))).Scan(&out))
			groups := out[0].Plan.ActualRows
			read, scans := out[0].Plan.read()
			require.Positive(t, groups)
			for _, s := range scans {
				require.Regexp(t, `^Index (Only )?Scan `+tables.WithDefaults().Prefix+`dead_letters_(consumer_)?reason_idx$`, s,
					"%s %+v %s: only the groups' indexes", state, f, mode)
			}
			// Per group: its key and the next, its newest, and its capped count.
			require.Less(t, read, groups*(countCap+10), "%s %+v %s: %v groups of %d rows read %v entries: %v",
				state, f, mode, groups, rows, read, scans)
		}
	}
}
