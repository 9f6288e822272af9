package projection

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/configerr"
	"github.com/idemkit/idem/internal/shadow"
)

// Config declares a projection. Name and Tables are required.
type Config struct {
	// MeterProvider provides the metric of the projection's guards
	// (idem.projection.events). Default: the global provider.
	MeterProvider metric.MeterProvider

	// Name names the projection in metrics, in parked events and in rebuild
	// runs. Required.
	Name string

	// Schema is the schema of Tables. Default: "public".
	Schema string

	// Tables are the tables the projection's handler writes, unqualified:
	// all of them, since a rebuild sends the handler's writes to shadow
	// copies of exactly these tables and swaps them in together. Required.
	Tables []string
}

// ErrConfig is returned (wrapped) by New and NewGuard for a configuration
// they cannot use. It matches idem.ErrConfig.
var ErrConfig = configerr.New("projection: invalid configuration")

// Projection is a declared projection: its name, schema and tables. It is
// safe for concurrent use.
type Projection struct {
	name   string
	schema string
	tables []string
	live   map[string]string // table → quoted live name
	shadow map[string]string // table → quoted shadow name
	m      *metrics
}

// New returns the projection cfg declares.
func New(cfg Config) (*Projection, error) {
	if cfg.Schema == "" {
		cfg.Schema = idem.DefaultSchema
	}
	switch {
	case strings.TrimSpace(cfg.Name) == "":
		return nil, fmt.Errorf("%w: Name is required", ErrConfig)
	case len(cfg.Tables) == 0:
		return nil, fmt.Errorf("%w: projection %q declares no Tables", ErrConfig, cfg.Name)
	}
	p := &Projection{name: cfg.Name, schema: cfg.Schema, tables: slices.Clone(cfg.Tables),
		live: map[string]string{}, shadow: map[string]string{}}
	for _, t := range cfg.Tables {
		switch {
		case t == "" || strings.ContainsRune(t, 0) || len(t) > 63:
			return nil, fmt.Errorf("%w: projection %q: table name %q", ErrConfig, cfg.Name, t)
		case p.live[t] != "":
			return nil, fmt.Errorf("%w: projection %q declares table %q twice", ErrConfig, cfg.Name, t)
		}
		p.live[t] = pgx.Identifier{cfg.Schema, t}.Sanitize()
		p.shadow[t] = pgx.Identifier{cfg.Schema, shadow.Table(t)}.Sanitize()
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("projection: metrics: %w", err)
	}
	p.m = m
	return p, nil
}

// Name returns the projection's name.
func (p *Projection) Name() string { return p.name }

// Schema returns the schema of the projection's tables.
func (p *Projection) Schema() string { return p.schema }

// Tables returns the declared tables, unqualified, in declaration order.
func (p *Projection) Tables() []string { return slices.Clone(p.tables) }

// Table returns the quoted, schema-qualified name of the declared table
// name for SQL run in ctx: the live table, or its shadow while a rebuild of
// this projection runs the handler. Call it where the statement is built,
// with the handler's context:
//
//	_, err := tx.Exec(ctx, `INSERT INTO `+p.Table(ctx, "order_overview")+` …`, …)
//
// It panics when name is not declared, or when ctx is a rebuild of another
// projection: the write would reach a live table the rebuild must not touch.
// (The runtime turns a handler's panic into an error.)
func (p *Projection) Table(ctx context.Context, name string) string {
	live, ok := p.live[name]
	if !ok {
		panic(fmt.Sprintf("projection %q does not declare table %q (Config.Tables: %q)", p.name, name, p.tables))
	}
	rebuilt, ok := shadow.From(ctx)
	switch {
	case !ok:
		return live
	case rebuilt != p.name:
		panic(fmt.Sprintf("projection %q: table %q written during a rebuild of projection %q: "+
			"a rebuild's handler may write only the tables of the projection it rebuilds", p.name, name, rebuilt))
	default:
		return p.shadow[name]
	}
}

// scope returns the scope of the rows idem keeps for the projection in
// ctx: its name, or the rebuild's scope.
func (p *Projection) scope(ctx context.Context) string {
	if rebuilt, ok := shadow.From(ctx); ok && rebuilt == p.name {
		return shadow.Scope(p.name)
	}
	return p.name
}
