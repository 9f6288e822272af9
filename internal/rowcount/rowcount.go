// Package rowcount counts rows for the operators' summaries (`idem ledger
// stats`, `idem inbox stats`) with work bounded by what they print, at any
// depth of history: a value with few rows is counted exactly through an
// index, reading at most Cap of them; a value with more is estimated from
// the planner's statistics (the last ANALYZE's sample of the column,
// scaled to the table's current size), which reads no row of the table.
package rowcount

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// Cap is the most rows an exact count reads: a value the statistics put at
// Cap rows or more is estimated instead.
const Cap = 1000

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Count is a number of rows, exact or estimated.
type Count struct {
	// N is the number of rows.
	N int64
	// Estimated reports that N is the planner's estimate: the statistics
	// put the value at Cap rows or more, or an exact count reached Cap.
	Estimated bool
}

// Stats is what the planner knows of one column of a table: of each of its
// partitions where it is partitioned (autovacuum analyses the partitions,
// never their parent), else of the table itself.
type Stats struct{ parts []partStats }

// partStats is what the planner knows of the column in one table (a
// partition, or the whole table when it is not partitioned).
type partStats struct {
	// rows is the table's estimated row count now: the last ANALYZE's or
	// VACUUM's count scaled by how the table's size changed since; -1
	// when the table was never analysed.
	rows float64
	// freq holds the fraction of the rows with each common value; rest is
	// the fraction of each other value (the rest spread over the distinct
	// values left), 0 when unknown.
	freq map[string]float64
	rest float64
}

// statsSQL reads the statistics of column $2 of each leaf of table $1 (the
// table itself when it is not partitioned): its estimated rows now, and
// the column's common values with their frequencies, its null fraction
// and distinct values.
const statsSQL = `SELECT
	CASE WHEN c.reltuples < 0 THEN -1
		WHEN c.relpages = 0 THEN c.reltuples
		ELSE c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)
	END::float8,
	coalesce(s.most_common_vals::text::text[], '{}'), coalesce(s.most_common_freqs, '{}'),
	coalesce(s.null_frac, 0)::float8, coalesce(s.n_distinct, 0)::float8
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = $2
WHERE c.oid = $1::regclass AND c.relkind <> 'p'
	OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf)`

// ReadStats reads the planner's statistics of column of table (a quoted,
// schema-qualified name), of each of its partitions if it has any.
func ReadStats(ctx context.Context, q Querier, table, column string) (Stats, error) {
	rows, err := q.Query(ctx, statsSQL, table, column)
	if err != nil {
		return Stats{}, fmt.Errorf("rowcount: statistics of %s.%s: %w", table, column, err)
	}
	var s Stats
	var (
		p                  partStats
		vals               []string
		freqs              []float32
		nullFrac, distinct float64
	)
	_, err = pgx.ForEachRow(rows, []any{&p.rows, &vals, &freqs, &nullFrac, &distinct}, func() error {
		s.parts = append(s.parts, newPartStats(p.rows, vals, freqs, nullFrac, distinct))
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("rowcount: statistics of %s.%s: %w", table, column, err)
	}
	return s, nil
}

// newPartStats is the statistics of one table of rows estimated rows: its
// column's common values vals with their frequencies freqs, its null
// fraction and its distinct values (a fraction of the rows when negative).
func newPartStats(rows float64, vals []string, freqs []float32, nullFrac, distinct float64) partStats {
	p := partStats{rows: rows, freq: map[string]float64{}}
	common := 0.0
	for i, v := range vals {
		if i < len(freqs) {
			p.freq[v] = float64(freqs[i])
			common += float64(freqs[i])
		}
	}
	if distinct < 0 { // a fraction of the rows
		distinct = -distinct * max(p.rows, 0)
	}
	if others := distinct - float64(len(p.freq)); others >= 1 {
		p.rest = max(1-common-nullFrac, 0) / others
	}
	return p
}

// Estimate returns the planner's estimate of the rows whose column holds
// value, summed over the tables analysed, and whether there is one (at
// least one table was analysed).
func (s Stats) Estimate(value string) (float64, bool) {
	sum, known := 0.0, false
	for _, p := range s.parts {
		if p.rows < 0 {
			continue
		}
		f, ok := p.freq[value]
		if !ok {
			f = p.rest
		}
		sum, known = sum+f*p.rows, true
	}
	return sum, known
}

// Of counts the rows whose column holds value: exactly, with count, when
// the statistics put them below Cap (or the table was never analysed);
// else by the estimate. count(ctx, limit) must count the rows with value,
// reading at most limit of them (SELECT count(*) FROM (SELECT 1 … LIMIT
// $n)), through an index on the column.
func (s Stats) Of(ctx context.Context, value string, count func(ctx context.Context, limit int) (int64, error)) (Count, error) {
	est, ok := s.Estimate(value)
	if ok && est >= Cap {
		return Count{N: int64(math.Round(est)), Estimated: true}, nil
	}
	n, err := count(ctx, Cap)
	if err != nil {
		return Count{}, err
	}
	if n >= Cap {
		return Count{N: max(n, int64(math.Round(est))), Estimated: true}, nil
	}
	return Count{N: n}, nil
}
