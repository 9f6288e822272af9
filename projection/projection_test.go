package projection

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/shadow"
)

func TestAnEventAppliesOnlyWhenNewerAndAGapIsToldApart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version, current int64
		exists           bool
		want             verdict
	}{
		{version: 1, exists: false, want: inOrder},
		{version: 2, exists: false, want: gap},
		{version: 3, current: 2, exists: true, want: inOrder},
		{version: 2, current: 2, exists: true, want: stale},
		{version: 1, current: 2, exists: true, want: stale},
		{version: 5, current: 2, exists: true, want: gap},
	} {
		require.Equal(t, c.want, judge(c.version, c.current, c.exists, 1), "%+v", c)
	}
	require.Equal(t, inOrder, judge(0, 0, false, 0), "an entity whose first version is 0")
}

func TestTableSendsWritesToTheShadowOnlyDuringItsOwnRebuild(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Name: "overview", Schema: "shop", Tables: []string{"orders", "lines"}})
	require.NoError(t, err)
	ctx := context.Background()
	require.Equal(t, `"shop"."orders"`, p.Table(ctx, "orders"))
	require.Equal(t, `"shop"."lines__idem_rebuild"`, p.Table(shadow.With(ctx, "overview"), "lines"))
	require.Panics(t, func() { p.Table(ctx, "customers") }, "an undeclared table")
	require.Panics(t, func() { p.Table(shadow.With(ctx, "billing"), "orders") }, "a write to a live table during another rebuild")
	require.Equal(t, []string{"orders", "lines"}, p.Tables())
}

func TestNewRefusesADeclarationARebuildCouldNotUse(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"no name":     {Tables: []string{"t"}},
		"no tables":   {Name: "p"},
		"empty table": {Name: "p", Tables: []string{""}},
		"twice":       {Name: "p", Tables: []string{"t", "t"}},
		"too long":    {Name: "p", Tables: []string{string(make([]byte, 64))}},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, name)
	}
	p, err := New(Config{Name: "p", Tables: []string{"t"}})
	require.NoError(t, err)
	require.Equal(t, "public", p.Schema())
	for name, cfg := range map[string]GuardConfig[int]{
		"no projection": {Table: "t"},
		"undeclared":    {Projection: p, Table: "u"},
		"no functions":  {Projection: p, Table: "t", KeyColumn: "k", VersionColumn: "v"},
	} {
		_, err := NewGuard(cfg)
		require.ErrorIs(t, err, ErrConfig, name)
	}
}
