package testdb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Reads is what a piece of work cost one table, by PostgreSQL's own
// statistics (pg_stat_user_tables, pg_stat_user_indexes,
// pg_statio_user_tables).
type Reads struct {
	// Rows is the heap rows read: seq_tup_read + idx_tup_fetch (live rows
	// returned by sequential and index scans).
	Rows int64
	// Entries is the index entries read, over every index of the table:
	// idx_tup_read, dead entries included, which is where a scan that
	// starts again from the beginning pays for what it deleted before.
	Entries int64
	// Pages is the heap pages asked for: heap_blks_hit + heap_blks_read. A
	// sequential scan skips dead rows without counting them in Rows, not
	// their pages.
	Pages int64
	// Inserted, Updated and Deleted are the rows written: n_tup_ins,
	// n_tup_upd, n_tup_del.
	Inserted, Updated, Deleted int64
}

// Read returns Rows + Entries.
func (r Reads) Read() int64 { return r.Rows + r.Entries }

// String prints the counters in one line.
func (r Reads) String() string {
	return fmt.Sprintf("rows %d + index entries %d, pages %d, inserted %d, updated %d, deleted %d",
		r.Rows, r.Entries, r.Pages, r.Inserted, r.Updated, r.Deleted)
}

func (r Reads) minus(o Reads) Reads {
	return Reads{Rows: r.Rows - o.Rows, Entries: r.Entries - o.Entries, Pages: r.Pages - o.Pages,
		Inserted: r.Inserted - o.Inserted, Updated: r.Updated - o.Updated, Deleted: r.Deleted - o.Deleted}
}

// Work is the Reads of each table of a schema that a piece of work
// touched, by table name (without schema).
type Work map[string]Reads

// String prints one line per table, in name order.
func (w Work) String() string {
	var b strings.Builder
	for _, t := range slices.Sorted(maps.Keys(w)) {
		fmt.Fprintf(&b, "\n\t%s: %v", t, w[t])
	}
	return b.String()
}

// The bounds of invariant 18: per row a statement returns or deletes, at
// most MaxReadsPerRow rows and index entries read and MaxPagesPerRow heap
// pages asked for, in every table.
const (
	MaxReadsPerRow = 4
	MaxPagesPerRow = 8
)

// RequirePerRow fails the test unless, in every table of w, the rows and
// index entries read stay within MaxReadsPerRow and the heap pages within
// MaxPagesPerRow per row of rows (what the measured door returned or
// deleted; at least one). what names the door in the message.
func (w Work) RequirePerRow(tb testing.TB, what string, rows int64) {
	tb.Helper()
	n := max(rows, 1)
	tb.Logf("%s: %d rows:%v", what, rows, w)
	for _, t := range slices.Sorted(maps.Keys(w)) {
		r := w[t]
		if r.Read() > MaxReadsPerRow*n || r.Pages > MaxPagesPerRow*n {
			tb.Errorf("%s: %s: %.2f rows and index entries and %.2f pages per row (at most %d and %d): %v",
				what, t, float64(r.Read())/float64(n), float64(r.Pages)/float64(n), MaxReadsPerRow, MaxPagesPerRow, r)
		}
	}
}

// RequirePerDeleted fails the test unless every table of w stays within
// the bounds of RequirePerRow per row deleted from it; a table nothing was
// deleted from (a horizon, a hold) is held to the rows deleted from all the
// tables. what names the door in the message.
func (w Work) RequirePerDeleted(tb testing.TB, what string) {
	tb.Helper()
	var all int64
	for _, r := range w {
		all += r.Deleted
	}
	for _, t := range slices.Sorted(maps.Keys(w)) {
		n := w[t].Deleted
		if n == 0 {
			n = all
		}
		Work{t: w[t]}.RequirePerRow(tb, what, n)
	}
}

// A Meter measures what a piece of work costs the tables of one schema.
//
// PostgreSQL counts in each backend and publishes its counts to the shared
// statistics when the backend goes idle outside a transaction, at most
// once a second: counts younger than that wait for an idle timer (up to
// ten seconds) or for the backend's exit. A Meter has them published
// before it reads: it runs pg_stat_force_next_flush() on every idle
// connection of its pools (the backend publishes at the end of that very
// statement, before it answers), and it waits until every backend of the
// application names it is given has exited (a backend publishes before it
// leaves pg_stat_activity), for work done on connections closed since (a
// command's own pool). Run the work, and what it reads from the schema
// just before, on the pools given to NewMeter: a connection of the shared
// test pool that another test holds is not published. Work still running
// when the Meter reads is a test bug: Measure fails when a pool given to
// NewMeter has a connection in use.
type Meter struct {
	tb     testing.TB
	schema string
	pools  []*pgxpool.Pool
	apps   []string
}

// NewMeter returns a Meter for the tables of schema, publishing the counts
// of pools and of the idle connections of the shared test pool.
func NewMeter(tb testing.TB, schema string, pools ...*pgxpool.Pool) *Meter {
	tb.Helper()
	return &Meter{tb: tb, schema: schema, pools: pools}
}

// AwaitExit has Measure wait, before it reads, until no backend runs under
// application name app (set it in the URL of the pool the work opens and
// closes, e.g. with AppURL).
func (m *Meter) AwaitExit(app string) *Meter {
	m.apps = append(m.apps, app)
	return m
}

// AppURL returns URL() with application_name set to app.
func AppURL(app string) string {
	sep := "?"
	if strings.Contains(URL(), "?") {
		sep = "&"
	}
	return URL() + sep + "application_name=" + app
}

// Measure runs do and returns what it cost each table of the schema.
func (m *Meter) Measure(do func()) Work {
	m.tb.Helper()
	before := m.read()
	do()
	after := m.read()
	w := Work{}
	for t, r := range after {
		if d := r.minus(before[t]); d != (Reads{}) {
			w[t] = d
		}
	}
	return w
}

const countersSQL = `SELECT t.relname, t.seq_tup_read + coalesce(t.idx_tup_fetch, 0),
	coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes AS i WHERE i.relid = t.relid), 0)::bigint,
	coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0), t.n_tup_ins, t.n_tup_upd, t.n_tup_del
FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid)
WHERE t.schemaname = $1`

// read publishes every count and returns the schema's counters.
func (m *Meter) read() map[string]Reads {
	m.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m.publish(ctx)
	pool := Pool(m.tb)
	out := map[string]Reads{}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, countersSQL, m.schema)
		if err != nil {
			return err
		}
		var name string
		var r Reads
		_, err = pgx.ForEachRow(rows, []any{&name, &r.Rows, &r.Entries, &r.Pages, &r.Inserted, &r.Updated, &r.Deleted}, func() error {
			out[name] = r
			return nil
		})
		return err
	})
	if err != nil {
		m.tb.Fatalf("testdb: read the statistics of %s: %v", m.schema, err)
	}
	return out
}

// publish has every backend that worked for the test publish its counts.
func (m *Meter) publish(ctx context.Context) {
	m.tb.Helper()
	for _, app := range m.apps {
		for {
			var n int
			if err := Pool(m.tb).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
				m.tb.Fatalf("testdb: wait for the backends of %s: %v", app, err)
			}
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				m.tb.Fatalf("testdb: %d backends of %s still running", n, app)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	for i, p := range append([]*pgxpool.Pool{Pool(m.tb)}, m.pools...) {
		if n := p.Stat().AcquiredConns(); i > 0 && n > 0 {
			m.tb.Fatalf("testdb: measure: %d connections still in use: the work is not over", n)
		}
		for _, c := range p.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
			c.Release()
			if err != nil {
				m.tb.Fatalf("testdb: publish the statistics: %v", err)
			}
		}
	}
}
