package projection_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/shadow"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/projection"
)

// event is a test event: entity id, version and a value the row keeps.
type event struct {
	ID      string `json:"id"`
	Version int64  `json:"version"`
	Value   string `json:"value"`
}

// fixture is a schema with an entity table (and its shadow), a projection
// over it and a meter that records the guard's metric.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	p      *projection.Projection
	reader *sdkmetric.ManualReader
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	s := tables.QuotedSchema()
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+s+`.entities (id text PRIMARY KEY, version bigint NOT NULL, value text NOT NULL);
		CREATE TABLE `+s+`.entities__idem_rebuild (LIKE `+s+`.entities INCLUDING ALL)`)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	p, err := projection.New(projection.Config{Name: "entities", Schema: tables.Schema, Tables: []string{"entities"},
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	return &fixture{t: t, pool: pool, tables: tables, p: p, reader: reader}
}

func (f *fixture) guard(gaps projection.GapPolicy) *projection.Guard[event] {
	f.t.Helper()
	g, err := projection.NewGuard(projection.GuardConfig[event]{
		Projection: f.p, Table: "entities", KeyColumn: "id", VersionColumn: "version", Gaps: gaps, Tables: f.tables,
		Key:     func(ev event) string { return ev.ID },
		Version: func(ev event) int64 { return ev.Version },
		Apply: func(ctx context.Context, tx pgx.Tx, ev event) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+f.p.Table(ctx, "entities")+` (id, version, value) VALUES ($1, $2, $3)
				ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, value = EXCLUDED.value`, ev.ID, ev.Version, ev.Value)
			return err
		},
	})
	require.NoError(f.t, err)
	return g
}

// handle runs one event through g in its own transaction.
func (f *fixture) handle(ctx context.Context, g *projection.Guard[event], ev event) (projection.Decision, error) {
	var d projection.Decision
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		d, err = g.Handle(ctx, tx, ev)
		return err
	})
	return d, err
}

// rows returns table's rows as id → "version:value".
func (f *fixture) rows(table string) map[string]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT id, version, value FROM `+pgx.Identifier{f.tables.Schema, table}.Sanitize())
	require.NoError(f.t, err)
	out := map[string]string{}
	var id, value string
	var v int64
	_, err = pgx.ForEachRow(rows, []any{&id, &v, &value}, func() error { out[id] = fmt.Sprintf("%d:%s", v, value); return nil })
	require.NoError(f.t, err)
	return out
}

// counts returns the guard's metric by decision and mode.
func (f *fixture) counts() map[string]int64 {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(f.t, f.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.projection.events" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				d, _ := dp.Attributes.Value("decision")
				mode, _ := dp.Attributes.Value("idem.mode")
				p, _ := dp.Attributes.Value("idem.projection")
				require.Equal(f.t, "entities", p.AsString())
				out[d.AsString()+"/"+mode.AsString()] += dp.Value
			}
		}
	}
	return out
}

// history is three entities' events, versions 1 to 4.
func history() []event {
	var out []event
	for _, id := range []string{"a", "b", "c"} {
		for v := int64(1); v <= 4; v++ {
			out = append(out, event{ID: id, Version: v, Value: fmt.Sprintf("%s%d", id, v)})
		}
	}
	return out
}

func TestStaleEventIsANoOpAndCounted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := f.guard(projection.GapApply)
	ctx := context.Background()
	for _, ev := range []event{{"a", 1, "a1"}, {"a", 2, "a2"}, {"a", 1, "late"}, {"a", 2, "again"}} {
		_, err := f.handle(ctx, g, ev)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]string{"a": "2:a2"}, f.rows("entities"))
	require.Equal(t, map[string]int64{"applied/live": 2, "stale/live": 2}, f.counts())
}

func TestEveryGapPolicyThatAppliesEndsWithTheSameRowsWhateverTheOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	want := map[string]string{"a": "4:a4", "b": "4:b4", "c": "4:c4"}
	for _, gaps := range []projection.GapPolicy{projection.GapApply, projection.GapPark} {
		g := f.guard(gaps)
		for seed := range uint64(5) {
			evs := history()
			rand.New(rand.NewPCG(seed, 1)).Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
			_, err := f.pool.Exec(ctx, `TRUNCATE `+pgx.Identifier{f.tables.Schema, "entities"}.Sanitize())
			require.NoError(t, err)
			for _, ev := range evs {
				_, err := f.handle(ctx, g, ev)
				require.NoError(t, err)
			}
			require.Equal(t, want, f.rows("entities"), "policy %s, seed %d", gaps, seed)
		}
	}
	var parked int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.tables.Table("projection_parked")).Scan(&parked))
	require.Zero(t, parked, "an event stayed parked after its gap was filled")
	c := f.counts()
	require.Positive(t, c["parked/live"])
	require.Equal(t, c["parked/live"], c["unparked/live"], "every parked event was applied once its turn came")
}

func TestParkedEventWaitsForTheMissingVersionAndTheRowNeverSkipsOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := f.guard(projection.GapPark)
	ctx := context.Background()
	for _, ev := range []event{{"a", 1, "a1"}, {"a", 3, "a3"}, {"a", 4, "a4"}} {
		_, err := f.handle(ctx, g, ev)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]string{"a": "1:a1"}, f.rows("entities"), "versions 3 and 4 wait for 2")
	d, err := f.handle(ctx, g, event{"a", 2, "a2"})
	require.NoError(t, err)
	require.Equal(t, projection.Applied, d)
	require.Equal(t, map[string]string{"a": "4:a4"}, f.rows("entities"))
}

func TestGapFailFailsTheMessageAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := f.guard(projection.GapFail)
	ctx := context.Background()
	_, err := f.handle(ctx, g, event{"a", 1, "a1"})
	require.NoError(t, err)
	_, err = f.handle(ctx, g, event{"a", 3, "a3"})
	require.ErrorIs(t, err, projection.ErrGap)
	require.ErrorContains(t, err, "event version 3, row at version 1")
	require.Equal(t, map[string]string{"a": "1:a1"}, f.rows("entities"))
	require.Equal(t, int64(1), f.counts()["gap_failed/live"])
}

func TestForensicGuardSaysWhatItWouldDoInAReadOnlyTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := f.guard(projection.GapPark)
	ctx := context.Background()
	_, err := f.handle(ctx, g, event{"a", 2, "a2"})
	require.NoError(t, err) // parked: no row yet
	forensic := idem.WithMode(ctx, idem.Forensic)
	for ev, want := range map[event]projection.Decision{
		{"a", 1, "a1"}: projection.Applied, {"a", 3, "a3"}: projection.Parked, {"b", 1, "b1"}: projection.Applied,
	} {
		tx, err := f.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		require.NoError(t, err)
		d, err := g.Handle(forensic, tx, ev)
		require.NoError(t, err)
		require.Equal(t, want, d, "%+v", ev)
		require.NoError(t, tx.Rollback(ctx))
	}
	require.Empty(t, f.rows("entities"))
	require.Equal(t, int64(2), f.counts()["applied/forensic"])
}

func TestARebuildWritesAndParksBesideTheLiveProjection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	g := f.guard(projection.GapPark)
	live := context.Background()
	rebuild := shadow.With(idem.WithMode(live, idem.Rebuild), "entities")
	_, err := f.handle(live, g, event{"a", 1, "live"})
	require.NoError(t, err)
	for _, ev := range []event{{"a", 1, "a1"}, {"a", 3, "a3"}} {
		_, err := f.handle(rebuild, g, ev)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]string{"a": "1:live"}, f.rows("entities"), "the rebuild touched the live table")
	require.Equal(t, map[string]string{"a": "1:a1"}, f.rows("entities__idem_rebuild"))
	var scope string
	require.NoError(t, f.pool.QueryRow(live, `SELECT projection FROM `+f.tables.Table("projection_parked")).Scan(&scope))
	require.Equal(t, "entities@rebuild", scope)
	require.Equal(t, int64(1), f.counts()["parked/rebuild"])
}
