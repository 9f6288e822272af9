package console

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
)

// store is where the console reads and acts: each method is one call of a
// library's operator function, or, where no library function answers what
// a page needs at depth (a keyset page, a bounded window, an estimate), a
// read-only query of the console's own, marked so. Actions always go
// through the libraries, which audit them. A library function that comes
// to answer one of these queries replaces it here, and the pages do not
// change.
type store struct {
	cfg    Config
	pool   *pgxpool.Pool
	inbox  *inbox.Inbox
	ledger *ledger.Ledger
	keys   *httpinbox.Keys
	ops    *httpinbox.Operations
	sql    statements
}

func newStore(cfg Config) (*store, error) {
	ib, err := inbox.New(inbox.Config{Tables: cfg.Tables})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	led, err := ledger.New(ledger.Config{Pool: cfg.Pool, Tables: cfg.Tables})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	keys, err := httpinbox.NewKeys(cfg.Pool, cfg.Tables)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	ops, err := httpinbox.NewOperations(cfg.Pool, cfg.Tables)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return &store{cfg: cfg, pool: cfg.Pool, inbox: ib, ledger: led, keys: keys, ops: ops, sql: newStatements(cfg)}, nil
}

// statements are the console's own read-only queries, with the table
// names filled in.
type statements struct {
	consumersOf                                 func(table string) string
	recentInbox, recentDead, checkpoints        string
	newestTombstone, runProgress                string
	groupWindow, deadWindow, deadRows, deadByID string
	unknownPage, duePage, terminalWindow, byIDs string
	countUnknown, countDue, estimateTerminal    string
	estimateGroup, reltuples, discard, advisory string
	countTerminal                               string
}

func newStatements(cfg Config) statements {
	t := cfg.Tables
	r := strings.NewReplacer(
		"{inbox}", t.Table("inbox"), "{dl}", t.Table("dead_letters"), "{ledger}", t.Table("ledger"),
		"{audit}", t.Table("ledger_audit"), "{checkpoints}", t.Table("checkpoints"),
		"{tombstones}", t.Table("ledger_tombstones"), "{entry}", entryColumns, "{dlcols}", deadColumns,
	)
	return statements{
		consumersOf:      func(table string) string { return strings.ReplaceAll(r.Replace(consumersSQL), "{t}", t.Table(table)) },
		recentInbox:      r.Replace(recentInboxSQL),
		recentDead:       r.Replace(recentDeadSQL),
		checkpoints:      r.Replace(checkpointsSQL),
		newestTombstone:  r.Replace(newestTombstoneSQL),
		runProgress:      r.Replace(runProgressSQL),
		groupWindow:      r.Replace(groupWindowSQL),
		deadWindow:       r.Replace(deadWindowSQL),
		deadRows:         r.Replace(deadRowsSQL),
		deadByID:         r.Replace(deadByIDSQL),
		unknownPage:      r.Replace(unknownPageSQL),
		duePage:          r.Replace(duePageSQL),
		terminalWindow:   r.Replace(terminalWindowSQL),
		byIDs:            r.Replace(effectsByIDSQL),
		countUnknown:     r.Replace(countUnknownSQL),
		countDue:         r.Replace(countDueSQL),
		estimateTerminal: r.Replace(estimateTerminalSQL),
		countTerminal:    r.Replace(countTerminalSQL),
		estimateGroup:    r.Replace(estimateGroupSQL),
		reltuples:        reltuplesSQL,
		discard:          r.Replace(discardSQL),
		advisory:         advisorySQL,
	}
}

// count is a number a page shows: exact, at least (a bounded window was
// full), or the planner's estimate (a table too large to count).
type count struct {
	N    int64
	Kind countKind
}

// countKind says how a count was obtained.
type countKind int

const (
	exact countKind = iota
	atLeast
	estimated
)

// Estimated reports the planner's estimate.
func (c count) Estimated() bool { return c.Kind == estimated }

func (c count) String() string {
	switch c.Kind {
	case atLeast:
		return "≥ " + num(c.N)
	case estimated:
		return "≈ " + num(c.N)
	}
	return num(c.N)
}

// countThreshold is where the console stops counting rows and shows the
// planner's estimate instead, as riverui does: counting a million rows
// costs what reading them costs.
const countThreshold = 1000

// cappedCount counts the rows sql (a query returning one count of at most
// countThreshold+1 rows) finds, and when it finds more, shows the planner's
// estimate of estimateSQL (or at least countThreshold without one).
func (s *store) cappedCount(ctx context.Context, sql, estimateSQL string, args ...any) (count, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return count{}, err
	}
	if n <= countThreshold {
		return count{N: n}, nil
	}
	if estimateSQL == "" {
		return count{N: countThreshold, Kind: atLeast}, nil
	}
	e, err := s.estimate(ctx, estimateSQL, args...)
	if err != nil {
		return count{}, err
	}
	return count{N: max(e, countThreshold+1), Kind: estimated}, nil
}

// estimate is the planner's estimate of the rows sql returns (EXPLAIN, no
// execution).
func (s *store) estimate(ctx context.Context, sql string, args ...any) (int64, error) {
	var plan []byte
	if err := s.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		return 0, fmt.Errorf("estimate: %w", err)
	}
	var doc []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &doc); err != nil || len(doc) == 0 {
		return 0, fmt.Errorf("estimate: unreadable plan: %v", err)
	}
	return int64(doc[0].Plan.Rows), nil
}

// tableRows is the planner's idea of a table's size (pg_class.reltuples);
// -1 when the table was never analysed.
func (s *store) tableRows(ctx context.Context, table string) (int64, error) {
	var n float64
	err := s.pool.QueryRow(ctx, s.sql.reltuples, s.cfg.Tables.Schema, s.cfg.Tables.Prefix+table).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", table, err)
	}
	return int64(n), nil
}

// consumers lists the consumers with rows in table (inbox or dead_letters)
// by a skip scan of its (consumer, message_id) key: one index probe per
// consumer, whatever the number of rows. Console query: no library
// function lists them but inbox.Stats, which reads the whole table.
func (s *store) consumers(ctx context.Context, table string) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.sql.consumersOf(table), maxConsumers)
	if err != nil {
		return nil, fmt.Errorf("consumers of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("consumers of %s: %w", table, err)
	}
	return out, nil
}

// maxConsumers bounds the consumers a page lists.
const maxConsumers = 200
