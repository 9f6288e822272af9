package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// horizon is a fixture whose ledger counts what it suppresses, with a
// counting executor for "charge" effects.
type horizon struct {
	*fixture
	reader *sdkmetric.ManualReader
	calls  atomic.Int64
}

func newHorizon(t *testing.T) *horizon {
	t.Helper()
	h := &horizon{fixture: newFixture(t), reader: sdkmetric.NewManualReader()}
	var err error
	h.ledger, err = ledger.New(ledger.Config{Pool: h.pool, Tables: h.tables,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))})
	require.NoError(t, err)
	return h
}

func (h *horizon) executor() ledger.Executor {
	return funcExecutor{fn: func(context.Context, ledger.Call) (ledger.Result, error) {
		h.calls.Add(1)
		return ledger.Result{Status: ledger.StatusSucceeded}, nil
	}}
}

// charge is the effect of charging order.
func charge(order string) ledger.Effect {
	return ledger.Effect{Type: "charge", BusinessKey: order, Request: map[string]any{"order": order, "cents": 1200}}
}

// forget settles nothing itself: it makes every settled effect 200 days old
// and has retention delete the effects settled more than 180 days ago.
func (h *horizon) forget(t *testing.T) int64 {
	t.Helper()
	_, err := h.pool.Exec(context.Background(), `UPDATE `+h.tables.Table("ledger")+`
		SET completed_at = now() - interval '200 days', created_at = now() - interval '201 days'
		WHERE status IN ('succeeded', 'failed_terminal', 'suppressed')`)
	require.NoError(t, err)
	effects, _, err := ledger.DeleteSettled(context.Background(), h.pool, h.tables, time.Now().Add(-180*24*time.Hour), 2)
	require.NoError(t, err)
	return effects
}

// suppressed returns the idem.ledger.effects.suppressed counter by
// "effect_type/reason".
func (h *horizon) suppressed(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != "idem.ledger.effects.suppressed" {
				continue
			}
			for _, dp := range sum.DataPoints {
				typ, _ := dp.Attributes.Value(attribute.Key("effect_type"))
				reason, _ := dp.Attributes.Value(attribute.Key("reason"))
				out[typ.AsString()+"/"+reason.AsString()] += dp.Value
			}
		}
	}
	return out
}

// An effect that settled, and whose row retention removed, is suppressed
// when it is recorded again, immediately or deferred to the batch's flush,
// and counted; the target is called once in all.
func TestEffectRecordedAgainAfterRetentionIsSuppressedNeverSent(t *testing.T) {
	t.Parallel()
	h := newHorizon(t)
	ctx := context.Background()
	first := h.record(t, ctx, charge("o-1"), charge("o-2"))
	h.dispatch(t, ledger.DispatcherConfig{Executors: map[string]ledger.Executor{"charge": h.executor()}})
	for _, e := range first {
		h.waitFor(t, e.ID, status(ledger.StatusSucceeded))
	}
	require.EqualValues(t, 2, h.forget(t))
	_, err := h.ledger.Get(ctx, first[0].ID)
	require.ErrorIs(t, err, ledger.ErrNotFound, "retention removed the row")
	stone, err := h.ledger.Tombstone(ctx, first[0].ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, stone.Status)
	require.Equal(t, first[0].IdempotencyKey, stone.IdempotencyKey)
	require.WithinDuration(t, time.Now().Add(-200*24*time.Hour), stone.SettledAt, time.Hour)
	require.WithinDuration(t, time.Now(), stone.DeletedAt, time.Minute)

	// A repair records o-1 again in its own transaction; a batch records
	// o-2 again, deferred, beside a new effect o-3.
	again := h.record(t, ctx, charge("o-1"))[0]
	require.Equal(t, ledger.StatusSuppressed, again.Status)
	require.Contains(t, again.LastError, "settled before as succeeded at "+stone.SettledAt.UTC().Format("2006-01-02T15:04:05Z"))
	require.Contains(t, again.LastError, "never sent")
	require.NoError(t, pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		d := &idem.Deferred{}
		dctx := idem.WithDeferred(ctx, d)
		for _, e := range []ledger.Effect{charge("o-2"), charge("o-3")} {
			if _, err := h.ledger.Record(dctx, tx, e); err != nil {
				return err
			}
		}
		return d.Flush(ctx, tx)
	}))
	o2, err := h.ledger.Get(ctx, first[1].ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSuppressed, o2.Status)
	require.Contains(t, o2.LastError, "settled before as succeeded")

	o3 := h.waitFor(t, ledger.EffectID("charge", "o-3"), status(ledger.StatusSucceeded))
	require.Empty(t, o3.LastError)
	require.Equal(t, map[string]int64{"charge/tombstone": 2}, h.suppressed(t))
	require.EqualValues(t, 3, h.calls.Load(), "o-1 and o-2 charged once each, o-3 once")

	// Retention removes the suppressed rows in turn: the tombstones keep how
	// and when the effects first settled.
	require.EqualValues(t, 3, h.forget(t))
	again2, err := h.ledger.Tombstone(ctx, first[0].ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StatusSucceeded, again2.Status)
	require.Equal(t, stone.SettledAt, again2.SettledAt)
}

// Rebuild suppression is counted by the same counter, with its own reason.
func TestRebuildSuppressionIsCountedWithItsReason(t *testing.T) {
	t.Parallel()
	h := newHorizon(t)
	ctx := idem.WithMode(context.Background(), idem.Rebuild)
	e := h.record(t, ctx, charge("o-1"))[0]
	require.Equal(t, ledger.StatusSuppressed, e.Status)
	h.record(t, ctx, charge("o-1")) // recorded before: nothing new is suppressed
	require.Equal(t, map[string]int64{"charge/rebuild": 1}, h.suppressed(t))
}

// Retention deletes an effect and writes its tombstone in one statement:
// when either fails, neither happens, and the chunk's other effects stay
// too.
func TestRetentionWritesTheTombstoneInTheTransactionThatDeletesTheEffect(t *testing.T) {
	t.Parallel()
	h := newHorizon(t)
	ctx := context.Background()
	ids := make([]string, 0, 4)
	for i := range 4 {
		ids = append(ids, h.record(t, ctx, charge(fmt.Sprintf("o-%d", i)))[0].ID)
	}
	_, err := h.pool.Exec(ctx, `UPDATE `+h.tables.Table("ledger")+` SET status = 'succeeded', completed_at = now() - interval '1 day'`)
	require.NoError(t, err)
	count := func(table string) (n int) {
		require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM `+h.tables.Table(table)).Scan(&n))
		return n
	}
	fail := func(table, when, id string) {
		_, err := h.pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF TG_OP = 'DELETE' THEN
					IF OLD.effect_id = %[2]s THEN RAISE EXCEPTION 'refused'; END IF;
					RETURN OLD;
				END IF;
				IF NEW.effect_id = %[2]s THEN RAISE EXCEPTION 'refused'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER refuse %[3]s ON %[4]s FOR EACH ROW EXECUTE FUNCTION %[1]s.refuse()`,
			h.tables.QuotedSchema(), quoteLiteral(id), when, h.tables.Table(table)))
		require.NoError(t, err)
	}
	unfail := func(table string) {
		_, err := h.pool.Exec(ctx, `DROP TRIGGER refuse ON `+h.tables.Table(table)+`; DROP FUNCTION `+h.tables.QuotedSchema()+`.refuse()`)
		require.NoError(t, err)
	}

	// The tombstone cannot be written: the effect stays, with the others of
	// its chunk.
	fail("ledger_tombstones", "BEFORE INSERT", ids[0])
	n, _, err := ledger.DeleteSettled(ctx, h.pool, h.tables, time.Now(), 10)
	require.ErrorContains(t, err, "refused")
	require.Zero(t, n)
	require.Equal(t, 4, count("ledger"))
	require.Zero(t, count("ledger_tombstones"))
	unfail("ledger_tombstones")

	// The delete fails: no tombstone is left for an effect that stays.
	fail("ledger", "BEFORE DELETE", ids[1])
	_, _, err = ledger.DeleteSettled(ctx, h.pool, h.tables, time.Now(), 10)
	require.ErrorContains(t, err, "refused")
	require.Equal(t, 4, count("ledger"))
	require.Zero(t, count("ledger_tombstones"))
	unfail("ledger")

	n, _, err = ledger.DeleteSettled(ctx, h.pool, h.tables, time.Now(), 3)
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	require.Zero(t, count("ledger"))
	require.Equal(t, 4, count("ledger_tombstones"))
}

func quoteLiteral(s string) string { return "'" + s + "'" } // effect ids are hex digits

// A retention that commits while an effect is being recorded again (the
// insert's snapshot saw neither the tombstone nor, once it had waited, the
// row) still leaves the effect suppressed, immediate or deferred.
func TestEffectRecordedWhileRetentionRemovesItIsSuppressed(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			t.Parallel()
			h := newHorizon(t)
			ctx := context.Background()
			e := h.record(t, ctx, charge("o-1"))[0]
			_, err := h.pool.Exec(ctx, `UPDATE `+h.tables.Table("ledger")+` SET status = 'succeeded', completed_at = now()`)
			require.NoError(t, err)

			// Retention's statement, held open: the row deleted, its
			// tombstone written, not yet committed.
			retention, err := h.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = retention.Rollback(ctx) }()
			_, err = retention.Exec(ctx, `WITH gone AS (DELETE FROM `+h.tables.Table("ledger")+` WHERE effect_id = $1
				RETURNING effect_id, idempotency_key, status, completed_at)
				INSERT INTO `+h.tables.Table("ledger_tombstones")+` (effect_id, idempotency_key, status, settled_at)
				SELECT * FROM gone`, e.ID)
			require.NoError(t, err)

			failed := make(chan error, 1)
			pid := make(chan uint32, 1)
			go func() {
				failed <- pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
					pid <- tx.Conn().PgConn().PID()
					if !deferred {
						_, err := h.ledger.Record(ctx, tx, charge("o-1"))
						return err
					}
					d := &idem.Deferred{}
					if _, err := h.ledger.Record(idem.WithDeferred(ctx, d), tx, charge("o-1")); err != nil {
						return err
					}
					return d.Flush(ctx, tx)
				})
			}()
			waitForLock(t, h.pool, <-pid)
			require.NoError(t, retention.Commit(ctx))
			require.NoError(t, <-failed)
			stored, err := h.ledger.Get(ctx, e.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.StatusSuppressed, stored.Status)
			require.Contains(t, stored.LastError, "settled before as succeeded")
			require.Equal(t, map[string]int64{"charge/tombstone": 1}, h.suppressed(t))
		})
	}
}

// waitForLock waits until the backend pid waits for a lock.
func waitForLock(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "the record never waited for retention's lock")
		time.Sleep(5 * time.Millisecond)
	}
}

// Record probes the tombstones by key, once, in the statement that inserts
// the effect: one round trip as before, never a scan, however many
// tombstones there are, whether the effect has one or not; a deferred flush
// probes once per effect, and once per effect it inserted as pending in the
// guard it sends with the notification.
func TestRecordProbesTheTombstonesOnceWithoutARoundTripMore(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	var trips atomic.Int64
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = tripCounter{&trips}
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	l, err := ledger.New(ledger.Config{Tables: tables})
	require.NoError(t, err)
	stones := tables.Table("ledger_tombstones")
	_, err = pool.Exec(ctx, `INSERT INTO `+stones+` (effect_id, idempotency_key, status, settled_at)
		SELECT 'e-' || i, 'k-' || i, 'succeeded', now() - interval '1 year' FROM generate_series(1, 20000) AS i;
		ANALYZE `+stones)
	require.NoError(t, err)

	read := func(tx pgx.Tx) (scans, idx, tuples int64) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0),
			coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, stones).
			Scan(&scans, &idx, &tuples))
		return
	}
	// record records e and checks its cost: one round trip, one probe of
	// the tombstones, no scan.
	record := func(tx pgx.Tx, e ledger.Effect, want ledger.Status) {
		s0, i0, t0 := read(tx)
		before := trips.Load()
		got, err := l.Record(ctx, tx, e)
		require.NoError(t, err)
		require.Equal(t, want, got.Status)
		require.EqualValues(t, 1, trips.Load()-before, "Record is one round trip")
		s1, i1, t1 := read(tx)
		require.Zero(t, s1-s0, "no scan of the tombstones")
		require.EqualValues(t, 1, i1-i0, "the insert's probe")
		require.LessOrEqual(t, t1-t0, int64(1))
	}
	for round := range 8 { // past the five executions after which a generic plan may stick
		require.NoError(t, pgx.BeginFunc(ctx, traced, func(tx pgx.Tx) error {
			record(tx, ledger.Effect{Type: "charge", BusinessKey: "a", ID: fmt.Sprintf("e-%d", round*100+1), Request: []byte(`{}`)},
				ledger.StatusSuppressed)
			record(tx, ledger.Effect{Type: "charge", BusinessKey: "a", ID: fmt.Sprintf("new-%d", round), Request: []byte(`{}`)},
				ledger.StatusPending)

			s0, _, t0 := read(tx)
			d := &idem.Deferred{}
			dctx := idem.WithDeferred(ctx, d)
			for i := range 10 {
				_, err := l.Record(dctx, tx, ledger.Effect{Type: "charge", BusinessKey: "b", ID: fmt.Sprintf("e-%d", round*100+10+i), Request: []byte(`{}`)})
				require.NoError(t, err)
			}
			require.NoError(t, d.Flush(ctx, tx))
			s1, _, t1 := read(tx)
			require.Zero(t, s1-s0, "no scan of the tombstones")
			require.LessOrEqual(t, t1-t0, int64(10), "a probe per effect")
			return nil
		}))
	}
}

// tripCounter counts the statements and batches a connection sends.
type tripCounter struct{ n *atomic.Int64 }

func (c tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Ledger retention reads each settled effect about twice (its entry in the
// settled index, then its row by key), however many chunks it takes: each
// chunk starts where the one before it stopped, so it does not read again
// the effects already deleted, which a snapshot held open elsewhere keeps
// from being marked dead.
func TestLedgerRetentionReadsEachSettledEffectOnceWithASnapshotHeldOpen(t *testing.T) {
	t.Parallel()
	pool, tables := testdb.Schema(t)
	ctx := context.Background()
	const settled = 20000
	_, err := pool.Exec(ctx, `INSERT INTO `+tables.Table("ledger")+` (effect_id, effect_type, business_key, idempotency_key,
		request_hash, request, status, created_at, completed_at)
		SELECT 'e-' || i, 'charge', 'o-' || i, 'k-' || i, sha256(i::text::bytea), '{}', 'succeeded',
			now() - interval '300 days', now() - interval '200 days' + i * interval '1 second'
		FROM generate_series(1, $1::int) AS i`, settled)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+tables.Table("ledger"))
	require.NoError(t, err)

	held, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	_, err = held.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = held.Exec(ctx, `SELECT count(*) FROM `+tables.Table("ledger")) // takes the snapshot
	require.NoError(t, err)

	// One connection, so that its statistics can be flushed on demand.
	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	reads := func() (n int64) {
		_, err := one.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = one.Exec(ctx, `SELECT 1`) // the flush happens as the one before ends
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot(), coalesce(seq_tup_read, 0) +
			(SELECT sum(idx_tup_read) FROM pg_stat_user_indexes AS i WHERE i.relid = t.relid)::bigint
			FROM pg_stat_user_tables AS t WHERE relid = $1::regclass`, tables.Table("ledger")).Scan(nil, &n))
		return n
	}
	before := reads()
	effects, _, err := ledger.DeleteSettled(ctx, one, tables, time.Now().Add(-180*24*time.Hour), 200)
	require.NoError(t, err)
	require.EqualValues(t, settled, effects)
	read := reads() - before
	t.Logf("%d rows and index entries read to delete %d effects", read, settled)
	require.LessOrEqual(t, read, int64(3*settled), "%d rows and index entries read to delete %d effects in %d chunks",
		read, settled, settled/200)
}
