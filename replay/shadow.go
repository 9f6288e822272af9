package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/shadow"
	"github.com/idemkit/idem/internal/store"
)

// shadowSet is the tables of an online rebuild: the projection's live tables
// and their shadows, in one schema.
type shadowSet struct {
	schema string
	tables []string
}

// live returns the quoted, qualified live table t.
func (s shadowSet) live(t string) string { return pgx.Identifier{s.schema, t}.Sanitize() }

// shadow returns the quoted, qualified shadow of t.
func (s shadowSet) shadow(t string) string {
	return pgx.Identifier{s.schema, shadow.Table(t)}.Sanitize()
}

// queryer runs statements that return rows: a pool or a transaction.
type queryer interface {
	store.Querier
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// create creates every shadow table like its live table — columns,
// defaults, constraints, indexes, identity, generated columns, comments,
// storage — with the live table's grants and foreign keys, and refuses
// (with ErrInvalidOptions) a live table that other objects depend on: the
// swap drops the live table, and could not.
func (s shadowSet) create(ctx context.Context, tx pgx.Tx) error {
	for _, t := range s.tables {
		live, sh := s.live(t), s.shadow(t)
		_, err := tx.Exec(ctx, `CREATE TABLE `+sh+` (LIKE `+live+` INCLUDING ALL)`)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42P01":
			return invalid("the projection's table %s does not exist: create it before rebuilding it", live)
		case errors.As(err, &pgErr) && pgErr.Code == "42P07":
			return invalid("the shadow table %s exists already: drop it, or abandon the rebuild that left it", sh)
		case err != nil:
			return fmt.Errorf("replay: create the shadow of %s: %w", live, err)
		}
		if err := s.copyGrants(ctx, tx, live, sh); err != nil {
			return err
		}
		if err := s.copyForeignKeys(ctx, tx, live, sh); err != nil {
			return err
		}
	}
	for _, t := range s.tables {
		if err := dependents(ctx, tx, s.live(t)); err != nil {
			return err
		}
		if err := uncopied(ctx, tx, s.live(t)); err != nil {
			return err
		}
	}
	return nil
}

// uncopiedSQL lists what a shadow would lose: triggers, row-level security
// and its policies, rules (LIKE copies none of them).
const uncopiedSQL = `SELECT 'trigger ' || tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal
UNION ALL SELECT 'policy ' || polname FROM pg_policy WHERE polrelid = $1::regclass
UNION ALL SELECT 'row-level security' FROM pg_class WHERE oid = $1::regclass AND relrowsecurity
UNION ALL SELECT 'rule ' || rulename FROM pg_rules WHERE (quote_ident(schemaname) || '.' || quote_ident(tablename))::regclass = $1::regclass
ORDER BY 1`

// uncopied refuses a table with what a shadow would not have: the swap
// would drop it with the live table.
func uncopied(ctx context.Context, tx pgx.Tx, live string) error {
	rows, err := tx.Query(ctx, uncopiedSQL, live)
	if err != nil {
		return fmt.Errorf("replay: inspect %s: %w", live, err)
	}
	lost, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("replay: inspect %s: %w", live, err)
	}
	if len(lost) > 0 {
		return invalid("%s has %s, which an online rebuild does not copy to its shadow and the swap would drop: "+
			"rebuild in place", live, strings.Join(lost, ", "))
	}
	return nil
}

// grantsSQL lists the privileges granted on a table to others than its
// owner; an empty grantee is PUBLIC.
const grantsSQL = `SELECT a.privilege_type, coalesce(r.rolname, ''), a.is_grantable
FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a LEFT JOIN pg_roles AS r ON r.oid = a.grantee
WHERE c.oid = $1::regclass AND a.grantee <> c.relowner
ORDER BY 2, 1`

// privileges are the table privileges aclexplode reports.
var privileges = map[string]bool{"SELECT": true, "INSERT": true, "UPDATE": true, "DELETE": true,
	"TRUNCATE": true, "REFERENCES": true, "TRIGGER": true, "MAINTAIN": true}

// copyGrants grants on sh what is granted on live, so that readers keep
// their access after the swap.
func (s shadowSet) copyGrants(ctx context.Context, tx pgx.Tx, live, sh string) error {
	rows, err := tx.Query(ctx, grantsSQL, live)
	if err != nil {
		return fmt.Errorf("replay: read the grants on %s: %w", live, err)
	}
	var grants []string
	var priv, role string
	var grantable bool
	_, err = pgx.ForEachRow(rows, []any{&priv, &role, &grantable}, func() error {
		if !privileges[priv] {
			return fmt.Errorf("unknown privilege %q", priv)
		}
		to := "PUBLIC"
		if role != "" {
			to = pgx.Identifier{role}.Sanitize()
		}
		g := `GRANT ` + priv + ` ON ` + sh + ` TO ` + to
		if grantable {
			g += ` WITH GRANT OPTION`
		}
		grants = append(grants, g)
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay: read the grants on %s: %w", live, err)
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, g); err != nil {
			return fmt.Errorf("replay: grant on the shadow of %s: %w", live, err)
		}
	}
	return nil
}

// foreignKeysSQL lists a table's foreign keys (LIKE does not copy them).
const foreignKeysSQL = `SELECT conname, pg_get_constraintdef(oid), confrelid = conrelid FROM pg_constraint
WHERE conrelid = $1::regclass AND contype = 'f' ORDER BY conname`

// copyForeignKeys adds live's foreign keys to sh; it refuses a foreign key
// from the table to itself, which would point the shadow at the live table.
func (s shadowSet) copyForeignKeys(ctx context.Context, tx pgx.Tx, live, sh string) error {
	rows, err := tx.Query(ctx, foreignKeysSQL, live)
	if err != nil {
		return fmt.Errorf("replay: read the foreign keys of %s: %w", live, err)
	}
	var adds []string
	var name, def string
	var self bool
	_, err = pgx.ForEachRow(rows, []any{&name, &def, &self}, func() error {
		if self {
			return invalid("%s has a foreign key to itself (%s): an online rebuild cannot copy it; rebuild in place", live, name)
		}
		adds = append(adds, `ALTER TABLE `+sh+` ADD CONSTRAINT `+pgx.Identifier{name}.Sanitize()+` `+def)
		return nil
	})
	if errors.Is(err, ErrInvalidOptions) {
		return err
	}
	if err != nil {
		return fmt.Errorf("replay: read the foreign keys of %s: %w", live, err)
	}
	for _, a := range adds {
		if _, err := tx.Exec(ctx, a); err != nil {
			return fmt.Errorf("replay: copy a foreign key of %s: %w", live, err)
		}
	}
	return nil
}

// dependentsSQL lists the objects that depend on a table, or on a sequence
// it owns, and are not the table's own (its constraints and defaults):
// views, other tables' foreign keys, defaults of other tables (the shadow's
// copy of a serial column's default). Dropping the table would fail because
// of them.
const dependentsSQL = `SELECT DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid)
FROM pg_depend AS d
WHERE d.refclassid = 'pg_class'::regclass AND d.deptype = 'n'
	AND (d.refobjid = $1::regclass OR d.refobjid IN (
		SELECT s.objid FROM pg_depend AS s JOIN pg_class AS c ON c.oid = s.objid AND c.relkind = 'S'
		WHERE s.classid = 'pg_class'::regclass AND s.refclassid = 'pg_class'::regclass
			AND s.refobjid = $1::regclass AND s.deptype = 'a'))
	AND NOT (d.classid = 'pg_attrdef'::regclass
		AND EXISTS (SELECT 1 FROM pg_attrdef AS ad WHERE ad.oid = d.objid AND ad.adrelid = $1::regclass))
	AND NOT (d.classid = 'pg_constraint'::regclass
		AND EXISTS (SELECT 1 FROM pg_constraint AS c WHERE c.oid = d.objid AND c.conrelid = $1::regclass))
ORDER BY 1`

// dependents refuses a table that other objects depend on.
func dependents(ctx context.Context, tx pgx.Tx, live string) error {
	rows, err := tx.Query(ctx, dependentsSQL, live)
	if err != nil {
		return fmt.Errorf("replay: find what depends on %s: %w", live, err)
	}
	deps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("replay: find what depends on %s: %w", live, err)
	}
	if len(deps) > 0 {
		return invalid("other objects depend on %s (%s): the swap drops the live table and could not; "+
			"drop them and recreate them after the rebuild, use an identity column instead of serial, "+
			"or rebuild in place", live, strings.Join(deps, "; "))
	}
	return nil
}

// missing returns the shadow tables that do not exist.
func (s shadowSet) missing(ctx context.Context, q store.Querier) ([]string, error) {
	var out []string
	for _, t := range s.tables {
		var ok bool
		if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.shadow(t)).Scan(&ok); err != nil {
			return nil, fmt.Errorf("replay: look for %s: %w", s.shadow(t), err)
		}
		if !ok {
			out = append(out, s.shadow(t))
		}
	}
	return out, nil
}

// drop drops the shadow tables that exist.
func (s shadowSet) drop(ctx context.Context, tx pgx.Tx) error {
	for _, t := range s.tables {
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+s.shadow(t)); err != nil {
			return fmt.Errorf("replay: drop %s: %w", s.shadow(t), err)
		}
	}
	return nil
}

// analyze gathers the planner's statistics on the shadows, so that queries
// on the swapped-in tables are planned well from the first one.
func (s shadowSet) analyze(ctx context.Context, q queryer) error {
	for _, t := range s.tables {
		if _, err := q.Exec(ctx, `ANALYZE `+s.shadow(t)); err != nil {
			return fmt.Errorf("replay: analyze %s: %w", s.shadow(t), err)
		}
	}
	return nil
}

// indexesSQL lists a table's indexes with what tells them apart besides
// their names: uniqueness, primary key, and the definition after USING.
const indexesSQL = `SELECT i.relname, ix.indisunique::text || ix.indisprimary::text ||
	coalesce(substring(pg_get_indexdef(ix.indexrelid) FROM ' USING .*$'), '')
FROM pg_index AS ix JOIN pg_class AS i ON i.oid = ix.indexrelid
WHERE ix.indrelid = $1::regclass ORDER BY i.relname`

// index is an index's name and shape (indexesSQL).
type index struct{ Name, Shape string }

func indexes(ctx context.Context, tx pgx.Tx, table string) ([]index, error) {
	rows, err := tx.Query(ctx, indexesSQL, table)
	if err != nil {
		return nil, fmt.Errorf("replay: list the indexes of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[index])
	if err != nil {
		return nil, fmt.Errorf("replay: list the indexes of %s: %w", table, err)
	}
	return out, nil
}

// replace makes every shadow its live table, in tx: it locks the live
// tables (readers wait, for the rest of the transaction), drops them,
// renames the shadows to their names and gives the shadows' indexes the
// names of the live indexes of the same shape, so that ON CONFLICT ON
// CONSTRAINT and index hints keep working.
func (s shadowSet) replace(ctx context.Context, tx pgx.Tx) error {
	lives := make([]string, len(s.tables))
	for i, t := range s.tables {
		lives[i] = s.live(t)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+strings.Join(lives, ", ")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("replay: lock the live tables: %w", err)
	}
	for _, t := range s.tables {
		if err := s.replaceOne(ctx, tx, t); err != nil {
			return err
		}
	}
	return nil
}

// replaceOne makes the shadow of t the live table t.
func (s shadowSet) replaceOne(ctx context.Context, tx pgx.Tx, t string) error {
	live, sh := s.live(t), s.shadow(t)
	liveIdx, err := indexes(ctx, tx, live)
	if err != nil {
		return err
	}
	shIdx, err := indexes(ctx, tx, sh)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DROP TABLE `+live); err != nil {
		return fmt.Errorf("replay: drop the live table %s: %w", live, err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE `+sh+` RENAME TO `+pgx.Identifier{t}.Sanitize()); err != nil {
		return fmt.Errorf("replay: rename %s to %s: %w", sh, live, err)
	}
	used := make([]bool, len(liveIdx))
	for _, si := range shIdx {
		for j, li := range liveIdx {
			if used[j] || li.Shape != si.Shape || li.Name == si.Name {
				continue
			}
			used[j] = true
			_, err := tx.Exec(ctx, `ALTER INDEX `+pgx.Identifier{s.schema, si.Name}.Sanitize()+` RENAME TO `+
				pgx.Identifier{li.Name}.Sanitize())
			if err != nil {
				return fmt.Errorf("replay: rename index %s of %s: %w", si.Name, live, err)
			}
			break
		}
	}
	return nil
}
