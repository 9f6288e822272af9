package idem

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/configerr"
)

// Default schema and table prefix.
const (
	DefaultSchema = "public"
	DefaultPrefix = "idem_"
)

// maxIdentifierLen is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, which could make two tables collide.
const maxIdentifierLen = 63

// ErrInvalidTables is returned (wrapped) when a schema or prefix cannot be
// used. It matches ErrConfig.
var ErrInvalidTables = configerr.New("idem: invalid schema or table prefix")

// Tables says where idem's tables live: every table is Schema.Prefix+name,
// always quoted as an identifier, so any name is safe to configure.
type Tables struct {
	// Schema is the PostgreSQL schema. Default: "public".
	Schema string
	// Prefix is put before every table name. Default: "idem_".
	Prefix string
}

// WithDefaults returns t with empty fields set to their defaults. An empty
// Prefix becomes DefaultPrefix; a prefix of "" is not configurable.
func (t Tables) WithDefaults() Tables {
	if t.Schema == "" {
		t.Schema = DefaultSchema
	}
	if t.Prefix == "" {
		t.Prefix = DefaultPrefix
	}
	return t
}

// longestTable is the longest table or index suffix idem appends to Prefix.
const longestTable = 32

// Validate reports whether the (defaulted) names can be used. Names may hold
// any character but NUL; they must fit PostgreSQL's 63-byte identifier limit
// once the longest table name is appended to the prefix.
func (t Tables) Validate() error {
	t = t.WithDefaults()
	if strings.ContainsRune(t.Schema, 0) || strings.ContainsRune(t.Prefix, 0) {
		return fmt.Errorf("%w: NUL byte in name", ErrInvalidTables)
	}
	if len(t.Schema) > maxIdentifierLen {
		return fmt.Errorf("%w: schema %q is longer than %d bytes", ErrInvalidTables, t.Schema, maxIdentifierLen)
	}
	if len(t.Prefix)+longestTable > maxIdentifierLen {
		return fmt.Errorf("%w: prefix %q is longer than %d bytes", ErrInvalidTables, t.Prefix, maxIdentifierLen-longestTable)
	}
	return nil
}

// Table returns the quoted, schema-qualified name of the idem table name,
// e.g. "public"."idem_inbox".
func (t Tables) Table(name string) string {
	t = t.WithDefaults()
	return pgx.Identifier{t.Schema, t.Prefix + name}.Sanitize()
}

// Name returns the quoted, unqualified name Prefix+name, for indexes and
// constraints.
func (t Tables) Name(name string) string {
	t = t.WithDefaults()
	return pgx.Identifier{t.Prefix + name}.Sanitize()
}

// QuotedSchema returns the quoted schema name.
func (t Tables) QuotedSchema() string {
	t = t.WithDefaults()
	return pgx.Identifier{t.Schema}.Sanitize()
}
