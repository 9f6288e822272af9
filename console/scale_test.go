//go:build scale

package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// pageBudget is how long a page may take: an interactive page, with a
// million dead letters and a million effects behind it.
const pageBudget = 200 * time.Millisecond

// fillSQL fills the three large tables with a million rows each, spread
// over the last twelve days: dead letters of three consumers (a reason
// present only among the oldest hundred, so that a filter on it must look
// far), effects in every status (unknown, failed_terminal with half of
// them resolved, due and retrying among a majority succeeded) and inbox
// rows (one in twenty seen again).
var fillSQL = []string{
	`INSERT INTO {dl} (consumer, message_id, payload_hash, reason, error, source, attempts, dead_lettered_at, redriven_at)
	SELECT (ARRAY['billing', 'shipping', 'mail'])[1 + i % 3], 'm-' || i, sha256(i::text::bytea),
		CASE WHEN i <= 100 THEN 'rare_reason' WHEN i % 20 = 0 THEN 'payload_conflict' WHEN i % 4 = 0 THEN 'permanent'
			ELSE 'max_attempts' END,
		'handler failed: ' || i, (ARRAY['billing.q', 'shipping.q', 'mail.q'])[1 + i % 3], 3,
		now() - (1000000 - i) * interval '1 second', CASE WHEN i % 10 = 0 THEN now() END
	FROM generate_series(1, 1000000) AS i`,
	`INSERT INTO {ledger} (effect_id, effect_type, consumer, message_id, business_key, target, idempotency_key, request_hash,
		request, status, attempt_count, next_attempt_at, last_error, created_at, completed_at)
	SELECT 'e-' || i, 'payment.capture', 'billing', 'm-' || i, 'order-' || i, 'https://gateway.example/charges', 'k-' || i,
		sha256(i::text::bytea), '{}'::bytea, s.status, 1,
		now() - (1000000 - i) * interval '1 second' + interval '1 minute', '', now() - (1000000 - i) * interval '1 second',
		CASE WHEN s.status IN ('succeeded', 'failed_terminal') THEN now() - (1000000 - i) * interval '1 second' END
	FROM generate_series(1, 1000000) AS i,
		LATERAL (SELECT CASE WHEN i % 50 = 1 THEN 'unknown' WHEN i % 50 = 2 THEN 'failed_terminal'
			WHEN i % 50 = 3 THEN 'pending' WHEN i % 50 = 4 THEN 'failed_retryable' ELSE 'succeeded' END AS status) AS s`,
	`INSERT INTO {audit} (effect_id, operator, from_status, to_status, reason)
	SELECT 'e-' || i, 'alice', 'unknown', 'failed_terminal', 'checked' FROM generate_series(2, 1000000, 100) AS i`,
	`INSERT INTO {inbox} (consumer, message_id, payload_hash, source, received_at, seen_at)
	SELECT (ARRAY['billing', 'shipping', 'mail'])[1 + i % 3], 'm-' || i, sha256(i::text::bytea),
		(ARRAY['billing.q', 'shipping.q', 'mail.q'])[1 + i % 3], now() - (1000000 - i) * interval '1 second',
		CASE WHEN i % 20 = 0 THEN now() - (1000000 - i) * interval '1 second' + interval '5 seconds' END
	FROM generate_series(1, 1000000) AS i`,
	`ANALYZE {dl}`, `ANALYZE {ledger}`, `ANALYZE {audit}`, `ANALYZE {inbox}`,
}

// recorder keeps every statement the console sends, with its arguments.
type recorder struct {
	mu   sync.Mutex
	seen map[string][]any
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !strings.HasPrefix(d.SQL, "EXPLAIN") {
		var args []any
		for _, a := range d.Args {
			if _, mode := a.(pgx.QueryExecMode); !mode {
				args = append(args, a)
			}
		}
		r.seen[d.SQL] = args
	}
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestEveryPageAnswersFastAtDepth(t *testing.T) {
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	fill := strings.NewReplacer("{dl}", tables.Table("dead_letters"), "{ledger}", tables.Table("ledger"),
		"{audit}", tables.Table("ledger_audit"), "{inbox}", tables.Table("inbox"))
	start := time.Now()
	for _, sql := range fillSQL {
		_, err := pool.Exec(ctx, fill.Replace(sql))
		require.NoError(t, err)
	}
	t.Logf("filled 1M dead letters, 1M effects, 1M inbox rows in %s", time.Since(start).Round(time.Second))

	rec := &recorder{seen: map[string][]any{}}
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = rec
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	c, err := console.New(console.Config{Pool: traced, Tables: tables, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)

	pages := []string{"/", "/deadletters", "/deadletters?consumer=billing", "/deadletters?consumer=mail&reason=payload_conflict",
		"/deadletters?reason=rare_reason", "/deadletters?id=m-500000", "/deadletters?id=m-500000&consumer=shipping",
		"/deadletters/500000", "/ledger", "/ledger?show=unknown", "/ledger?show=failed_terminal", "/ledger?show=due",
		"/ledger/effect?id=e-500001", "/http", "/replays", "/partitions"}
	for i := 0; i < len(pages); i++ {
		body := timePage(t, srv.URL+pages[i])
		// Follow each list's next page once: a keyset page, or a search
		// that goes on below a window.
		if next := nextLink.FindStringSubmatch(body); next != nil && !strings.Contains(pages[i], "before=") &&
			!strings.Contains(pages[i], "after=") {
			pages = append(pages, strings.ReplaceAll(next[1], "&amp;", "&"))
		}
	}
	require.Greater(t, len(pages), 18, "the lists had next pages: %v", pages)
	requireNoSequentialScan(t, pool, tables, rec)
}

// nextLink is a list's link to its next page.
var nextLink = regexp.MustCompile(`<a href="(/(?:deadletters|ledger)\?[^"]*(?:before|after)=[^"]*)">`)

// timePage requests url once to warm the caches, then three times, and
// fails when the fastest of the three takes longer than pageBudget. It
// returns the page.
func timePage(t *testing.T, url string) string {
	t.Helper()
	var body string
	best := time.Hour
	for i := range 4 {
		start := time.Now()
		resp, err := http.Get(url)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, b)
		if took := time.Since(start); i > 0 && took < best {
			best = took
		}
		body = string(b)
	}
	t.Logf("%-60s %s", url, best.Round(100*time.Microsecond))
	require.Less(t, best, pageBudget, "%s took %s", url, best)
	return body
}

// requireNoSequentialScan explains every statement the console sent, in
// custom and generic plans, and fails when one reads a large table
// sequentially.
func requireNoSequentialScan(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, rec *recorder) {
	t.Helper()
	ctx := context.Background()
	big := map[string]bool{}
	for _, name := range []string{"dead_letters", "ledger", "inbox", "ledger_audit"} {
		big[tables.WithDefaults().Prefix+name] = true
	}
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Greater(t, len(rec.seen), 15)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode)
		require.NoError(t, err)
		for sql, args := range rec.seen {
			var plan []byte
			err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&plan)
			require.NoError(t, err, sql)
			var doc []map[string]any
			require.NoError(t, json.Unmarshal(plan, &doc))
			if rel := seqScan(doc[0]["Plan"], big); rel != "" {
				t.Errorf("%s: sequential scan of %s in\n%s\n%s", mode, rel, sql, plan)
			}
		}
	}
	_, _ = conn.Exec(ctx, "RESET plan_cache_mode")
}

// seqScan returns the large table a plan node (or one below it) reads
// sequentially, or "".
func seqScan(node any, big map[string]bool) string {
	n, ok := node.(map[string]any)
	if !ok {
		return ""
	}
	if n["Node Type"] == "Seq Scan" {
		if rel, _ := n["Relation Name"].(string); big[rel] {
			return rel
		}
	}
	plans, _ := n["Plans"].([]any)
	for _, p := range plans {
		if rel := seqScan(p, big); rel != "" {
			return rel
		}
	}
	return ""
}
