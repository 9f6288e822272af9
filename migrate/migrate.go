package migrate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/timeparts"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one versioned step of the schema.
type Migration struct {
	// Version orders migrations; it is the number the file name starts with.
	Version int
	// Name is the rest of the file name, without extension.
	Name string
	// SQL is the statement text with the schema and prefix filled in.
	SQL string
}

// All returns every migration for tables t, in version order.
func All(t idem.Tables) ([]Migration, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	t = t.WithDefaults()
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded sql: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		if !ok {
			return nil, fmt.Errorf("migrate: file %s: want NNNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migrate: file %s: version: %w", e.Name(), err)
		}
		raw, err := files.ReadFile(path.Join("sql", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", e.Name(), err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migrate: parse %s: %w", e.Name(), err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, t); err != nil {
			return nil, fmt.Errorf("migrate: render %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: buf.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrate: version %d appears twice", out[i].Version)
		}
	}
	return out, nil
}

// SQL returns the whole schema as one script, each migration introduced by a
// comment and followed by the insert that records it, for teams that apply
// migrations with their own tool.
func SQL(t idem.Tables) (string, error) {
	ms, err := All(t)
	if err != nil {
		return "", err
	}
	t = t.WithDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n%s;\n", t.QuotedSchema(), createMigrationsTable(t))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- idem migration %04d_%s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.SQL))
		fmt.Fprintf(&b, "INSERT INTO %s (version, name) VALUES (%d, %s);\n",
			t.Table("migrations"), m.Version, quoteLiteral(m.Name))
	}
	return b.String(), nil
}

// Result says what Up did.
type Result struct {
	// Applied lists the versions applied by this call, in order.
	Applied []int
	// Current is the highest version present after the call.
	Current int
	// KeptPlain lists the tables UpWith's PartitionWidth left in the plain
	// layout because they held rows ("dead_letters"): retention deletes
	// their rows one by one. Run the migration again once they are empty
	// (after `idem cleanup`) to lay them out in partitions.
	KeptPlain []string
}

// Options configures UpWith.
type Options struct {
	// PartitionWidth, when set, lays the inbox out in time partitions of
	// this width (inbox.LayOutPartitioned), from inbox.MinPartitionWidth
	// (a minute, for tests) to days, after the migrations and in their
	// transaction, then makes the first partitions (inbox.EnsurePartitions).
	// Retention then drops whole partitions. An inbox that holds rows is
	// converted online after the migrations commit, while workers run
	// (inbox.ConvertPartitioned); a schema partitioned already with this
	// width is left as it is. The dead-letter table is laid out in
	// partitions of the same width on the time each row was written
	// when it is empty (deadletters.DeleteBefore then drops them whole); one that holds rows
	// keeps the plain layout (Result.KeptPlain). Default: the plain layout,
	// one table each.
	PartitionWidth time.Duration
}

// Up applies every migration not yet recorded for tables t. It runs in one
// transaction holding an advisory lock derived from the schema name, so
// concurrent callers serialise and each version is applied once.
func Up(ctx context.Context, pool *pgxpool.Pool, t idem.Tables) (Result, error) {
	return UpWith(ctx, pool, t, Options{})
}

// UpWith is Up with options: the same migrations, and the inbox's layout.
func UpWith(ctx context.Context, pool *pgxpool.Pool, t idem.Tables, opts Options) (Result, error) {
	ms, err := All(t)
	if err != nil {
		return Result{}, err
	}
	t = t.WithDefaults()
	var ib *inbox.Inbox
	if opts.PartitionWidth != 0 {
		if ib, err = inbox.New(inbox.Config{Tables: t}); err != nil {
			return Result{}, fmt.Errorf("migrate: %w", err)
		}
	}
	var res Result
	convert := false
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := apply(ctx, tx, t, ms, &res); err != nil {
			return err
		}
		if ib == nil {
			return nil
		}
		err := ib.LayOutPartitioned(ctx, tx, opts.PartitionWidth)
		if errors.Is(err, inbox.ErrHoldsRows) {
			convert = true // after the migrations commit, online
		} else if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		err = deadLetters(t).LayOut(ctx, tx, opts.PartitionWidth)
		if errors.Is(err, timeparts.ErrHoldsRows) {
			res.KeptPlain = append(res.KeptPlain, "dead_letters")
		} else if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	switch {
	case convert:
		if err := ib.ConvertPartitioned(ctx, pool, opts.PartitionWidth); err != nil {
			return res, fmt.Errorf("migrate: %w", err)
		}
	case ib != nil:
		if _, err := ib.EnsurePartitions(ctx, pool, 0); err != nil {
			return res, fmt.Errorf("migrate: %w", err)
		}
	}
	if ib != nil {
		if _, err := deadLetters(t).Ensure(ctx, pool, 0); err != nil {
			return res, fmt.Errorf("migrate: %w", err)
		}
	}
	return res, nil
}

// deadLetters is the dead-letter table of t, as its time partitions see it.
func deadLetters(t idem.Tables) timeparts.Table {
	return timeparts.New(t, "dead_letters", "dead_lettered_at")
}

// apply applies, in tx, the migrations ms not yet recorded, under the
// schema's advisory lock, and fills res.
func apply(ctx context.Context, tx pgx.Tx, t idem.Tables, ms []Migration, res *Result) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockKey(t.Schema)); err != nil {
		return fmt.Errorf("migrate: advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+t.QuotedSchema()); err != nil {
		return fmt.Errorf("migrate: create schema %s: %w", t.Schema, err)
	}
	if _, err := tx.Exec(ctx, createMigrationsTable(t)); err != nil {
		return fmt.Errorf("migrate: create migrations table: %w", err)
	}
	rows, err := tx.Query(ctx, "SELECT version FROM "+t.Table("migrations"))
	if err != nil {
		return fmt.Errorf("migrate: read applied versions: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("migrate: read applied versions: %w", err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
		res.Current = max(res.Current, v)
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migrate: apply %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+t.Table("migrations")+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fmt.Errorf("migrate: record %04d_%s: %w", m.Version, m.Name, err)
		}
		res.Applied = append(res.Applied, m.Version)
		res.Current = max(res.Current, m.Version)
	}
	return nil
}

// LockKey is the advisory lock key Up takes for schema. It is exported so that
// operators can see who holds it in pg_locks.
func LockKey(schema string) int64 {
	sum := sha256.Sum256([]byte("idem.migrate:" + schema))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

func createMigrationsTable(t idem.Tables) string {
	return "CREATE TABLE IF NOT EXISTS " + t.Table("migrations") + ` (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
