// Package pgplan has PostgreSQL plan each execution of the statements that
// find rows by an array of keys (see PlannedNow).
package pgplan

import "github.com/jackc/pgx/v5"

// PlannedNow returns the arguments of a statement that finds rows by an
// array of keys, led by the query mode that has PostgreSQL plan it for
// this execution, at the table's present size. Pass them to Exec or Query
// in place of args.
//
// pgx prepares and caches statements; after five executions PostgreSQL may
// keep one generic plan for the statement, chosen with the statistics of
// that moment. Chosen while a young table held a few rows, it reads the
// keys' range by its leading column (every row of a consumer) and filters
// the array, and it keeps doing so after the table has grown, until
// autovacuum analyzes the table: each lookup of a batch's keys then reads
// the whole scope. Planning each execution costs one parse per batch.
// Connections that plan every statement already (exec mode, the simple
// protocol) keep their own mode. Arguments must encode in the text format
// (plain slices, not the inbox's pointer arrays).
func PlannedNow(conn *pgx.Conn, args ...any) []any {
	switch conn.Config().DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return args
	}
	return append([]any{pgx.QueryExecModeExec}, args...)
}
