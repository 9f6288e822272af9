package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/pglock"
)

// reader polls the count of a table, as a dashboard would, until stopped,
// and remembers what it saw.
type reader struct {
	polls, errs atomic.Int64
	mu          sync.Mutex
	firstErr    error
	decreases   []string
	stop        func()
}

// startReader polls `SELECT count(*) FROM table` in a loop.
func (e *env) startReader(table string) *reader {
	e.t.Helper()
	r := &reader{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := int64(-1)
		for ctx.Err() == nil {
			var n int64
			err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n)
			if ctx.Err() != nil {
				return
			}
			r.polls.Add(1)
			r.mu.Lock()
			switch {
			case err != nil:
				r.errs.Add(1)
				if r.firstErr == nil {
					r.firstErr = err
				}
			case n < last:
				r.decreases = append(r.decreases, fmt.Sprintf("%d after %d", n, last))
			}
			r.mu.Unlock()
			if err == nil {
				last = n
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	r.stop = func() { cancel(); <-done }
	e.t.Cleanup(r.stop)
	return r
}

// requireNeverSawLess fails the test if the reader saw an error or fewer
// rows than before.
func (r *reader) requireNeverSawLess(t *testing.T) {
	t.Helper()
	r.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NoError(t, r.firstErr, "the reader got an error (%d of %d polls)", r.errs.Load(), r.polls.Load())
	require.Empty(t, r.decreases, "the reader saw fewer rows than before")
	require.Greater(t, r.polls.Load(), int64(10))
}

// traffic publishes msgs(from, …) in chunks, as live producers do, until
// stopped.
type traffic struct {
	quit chan struct{}
	done chan error
	next atomic.Int64 // the first message not published yet
}

// startTraffic publishes chunk messages every 10ms from message from on.
func (e *env) startTraffic(from, chunk int) *traffic {
	tr := &traffic{quit: make(chan struct{}), done: make(chan error, 1)}
	tr.next.Store(int64(from))
	go func() {
		for i := from; ; i += chunk {
			select {
			case <-tr.quit:
				tr.done <- nil
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := e.se.Publish(context.Background(), e.stream, msgs(i, i+chunk)); err != nil {
				tr.done <- err
				return
			}
			tr.next.Store(int64(i + chunk))
		}
	}()
	return tr
}

// stop ends the traffic and returns the first message not published.
func (tr *traffic) stop(t *testing.T) int {
	t.Helper()
	close(tr.quit)
	require.NoError(t, <-tr.done)
	return int(tr.next.Load())
}

// tail returns the stream's last offset.
func (e *env) tail() int64 {
	e.t.Helper()
	tail, ok, err := e.se.Tail(context.Background(), e.stream)
	require.NoError(e.t, err)
	require.True(e.t, ok)
	return tail
}

// table returns a checksum of a table's rows.
func (e *env) table(name string) string {
	e.t.Helper()
	var n int64
	var sum string
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
		FROM `+e.tables.QuotedSchema()+`.`+name+` t`).Scan(&n, &sum))
	return fmt.Sprintf("%d rows, md5 %s", n, sum)
}

// requireAppliedOnce checks the final tables of a stream of msgs(0, n)
// (and maybe republished ones): every message applied once, by the rebuild
// if it is at or before the hand-off, by the live consumer after it.
func (e *env) requireAppliedOnce(n int, handoff int64) {
	e.t.Helper()
	require.Equal(e.t, expectedTotals(0, n), e.totals())
	got := e.applied()
	require.Len(e.t, got, n, "messages missing from the final tables")
	for id, times := range got {
		require.Equal(e.t, 1, times, "message %s applied %d times", id, times)
	}
	require.Zero(e.t, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied
		WHERE (mode = 'rebuild') <> (substr(message_id, 3)::bigint <= $1)`, handoff),
		"a message up to the hand-off was not applied by the rebuild, or one after it was")
}

func TestOnlineRebuildUnderLiveTrafficEqualsTheProjectionOfEveryEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	p := e.projection()
	e.publish(msgs(0, 2000)...)
	stopLive := e.startLive(e.consumer(&handler{e: e, proj: p}, nil))
	e.waitCheckpoint("test", 1999)
	s := e.tables.QuotedSchema()
	readers := []*reader{e.startReader(s + ".applied"), e.startReader(s + ".totals")}

	tr := e.startTraffic(2000, 50)
	progress := &lockedWriter{}
	sum, err := Run(ctx, e.consumer(&handler{e: e, proj: p, extra: true}, nil), Options{Mode: idem.Rebuild, Projection: p,
		BatchSize: 200, Progress: progress, ProgressInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	// Live traffic went on through the swap.
	time.Sleep(100 * time.Millisecond)
	n := tr.stop(t)
	require.Greater(t, int64(n-1), sum.Handoff, "the swap happened after the traffic")
	// Messages published again after the swap are duplicates for the live
	// consumer: the rebuild handed its inbox over.
	e.publish(msgs(1990, 2010)...)
	e.waitCheckpoint("test", e.tail())
	stopLive()
	for _, r := range readers {
		r.requireNeverSawLess(t)
	}

	require.True(t, sum.Swapped)
	require.GreaterOrEqual(t, sum.Handoff, int64(1999))
	require.Positive(t, sum.Pause)
	e.requireAppliedOnce(n, sum.Handoff)
	out := progress.String()
	require.Contains(t, out, "building")
	require.Contains(t, out, "behind the live consumer")
	require.Contains(t, out, fmt.Sprintf("swapped at offset %d", sum.Handoff))
	require.Zero(t, e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE '%idem_rebuild'`, e.tables.Schema),
		"a shadow table is left")
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = $1`, rebuildScope("test", sum.RunID)),
		"the rebuild's inbox rows are left after the hand-over")
	require.Equal(t, 5, e.count(`SELECT count(*) FROM `+e.tables.Table("ledger")+` WHERE effect_type = 'welcome' AND status = 'suppressed'`),
		"the new handler's effects for history are suppressed")
	require.Equal(t, "finished", e.runStatus(sum.RunID))
}

// interrupt sets up o and h so that a rebuild dies in phase, with the live
// worker of e running; it returns the first message not yet published.
func interrupt(e *env, phase string, o *Options, h *handler, kill func()) int {
	var applied atomic.Int64
	switch phase {
	case phaseBuilding:
		h.onApply = func() {
			if applied.Add(1) == 230 {
				kill()
			}
		}
		return 500
	case phaseCatchingUp:
		// The live worker moves on during the first pass; the rebuild dies
		// in its second.
		h.onApply = func() {
			switch applied.Add(1) {
			case 10:
				e.publish(msgs(500, 800)...)
			case 400:
				e.waitCheckpoint("test", 799)
			case 650:
				kill()
			}
		}
		return 800
	default:
		o.beforeSwapCommit = func(context.Context) error { return errors.New("the process dies in the swap") }
		return 500
	}
}

func TestInterruptedRebuildLeavesTheLiveTableServingAndResumes(t *testing.T) {
	t.Parallel()
	for _, phase := range []string{phaseBuilding, phaseCatchingUp, phaseSwapping} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p := e.projection()
			e.publish(msgs(0, 500)...)
			stopLive := e.startLive(e.consumer(&handler{e: e, proj: p}, nil))
			e.waitCheckpoint("test", 499)
			before := [2]string{e.table("totals"), e.table("applied")}

			ctx, kill := context.WithCancel(context.Background())
			defer kill()
			id := "run-" + phase
			progress := &lockedWriter{}
			o := Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: id, Progress: progress, ProgressInterval: time.Hour}
			h := &handler{e: e, proj: p}
			next := interrupt(e, phase, &o, h, kill)
			_, err := Run(ctx, e.consumer(h, nil), o)
			require.ErrorContains(t, err, "resume with run id "+id)
			require.Contains(t, progress.String(), "rebuild "+e.stream+": "+phase, "the run died in another phase")
			if phase != phaseCatchingUp {
				require.Equal(t, before, [2]string{e.table("totals"), e.table("applied")}, "the live tables changed")
			}
			require.Equal(t, expectedTotals(0, next), e.totals(), "the live table is consistent")
			require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.QuotedSchema()+`.applied WHERE mode <> ''`))
			require.Equal(t, "running", e.runStatus(id))

			// The live worker was never held for good: it goes on.
			e.publish(msgs(next, next+50)...)
			e.waitCheckpoint("test", int64(next+49))

			s, err := Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil),
				Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: id})
			require.NoError(t, err)
			require.True(t, s.Resumed)
			require.True(t, s.Swapped)
			require.EqualValues(t, next+49, s.Handoff)
			e.publish(msgs(next+50, next+100)...)
			e.waitCheckpoint("test", int64(next+99))
			stopLive()
			e.requireAppliedOnce(next+100, s.Handoff)
		})
	}
}

func TestAbandonedRebuildDropsItsShadowAndLeavesTheLiveProjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.projection()
	e.publish(msgs(0, 300)...)
	e.runLive(e.consumer(&handler{e: e, proj: p}, nil), 299)
	before := [2]string{e.table("totals"), e.table("applied")}
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	var applied atomic.Int64
	h := &handler{e: e, proj: p, onApply: func() {
		if applied.Add(1) == 100 {
			kill()
		}
	}}
	_, err := Run(ctx, e.consumer(h, nil), Options{Mode: idem.Rebuild, Projection: p, BatchSize: 50, RunID: "run-a"})
	require.Error(t, err)

	// Another rebuild may not start while this one keeps its shadows.
	_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, Projection: p})
	require.ErrorIs(t, err, ErrRebuildPending)
	require.ErrorContains(t, err, "run-a")
	// While a process runs it, it is neither resumed nor abandoned elsewhere.
	lock, err := pglock.Acquire(context.Background(), e.pool, rebuildLockKey(e.tables, "test", e.stream), pglock.Config{Logger: testLogger()})
	require.NoError(t, err)
	_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, Projection: p, RunID: "run-a"})
	require.ErrorIs(t, err, ErrRebuildRunning)
	require.ErrorIs(t, Abandon(context.Background(), e.pool, e.tables, "run-a"), ErrRebuildRunning)
	require.NoError(t, lock.Release(context.Background()))

	require.NoError(t, Abandon(context.Background(), e.pool, e.tables, "run-a"))
	require.Equal(t, before, [2]string{e.table("totals"), e.table("applied")})
	require.Equal(t, "abandoned", e.runStatus("run-a"))
	require.Zero(t, e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE '%idem_rebuild'`, e.tables.Schema))
	require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("inbox")+` WHERE consumer = $1`, rebuildScope("test", "run-a")))
	require.NoError(t, Abandon(context.Background(), e.pool, e.tables, "run-a"), "abandoning again finishes the clean-up")
	_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, Projection: p, RunID: "run-a"})
	require.ErrorIs(t, err, ErrRunMismatch, "an abandoned run does not resume")
	runs, err := ListRuns(context.Background(), e.pool, e.tables, RunFilter{})
	require.NoError(t, err)
	require.True(t, runs[0].Abandoned)
	require.Equal(t, []string{"totals", "applied"}, runs[0].Tables)

	s, err := Run(context.Background(), e.consumer(&handler{e: e, proj: p}, nil), Options{Mode: idem.Rebuild, Projection: p})
	require.NoError(t, err, "a new rebuild starts after the abandon")
	require.True(t, s.Swapped)
	e.requireAppliedOnce(300, 299)
}

func TestOnlineRebuildRefusesATableItsSwapCouldNotReplaceWhole(t *testing.T) {
	t.Parallel()
	for what, ddl := range map[string]string{
		"view":        `CREATE VIEW %[1]s.big AS SELECT * FROM %[1]s.totals WHERE sum > 100`,
		"foreign key": `CREATE TABLE %[1]s.notes (key text REFERENCES %[1]s.totals (key))`,
		"trigger": `CREATE FUNCTION %[1]s.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
			CREATE TRIGGER noop BEFORE INSERT ON %[1]s.totals FOR EACH ROW EXECUTE FUNCTION %[1]s.noop()`,
		"serial": `ALTER TABLE %[1]s.applied ADD COLUMN id serial`,
		"itself": `ALTER TABLE %[1]s.totals ADD COLUMN parent text REFERENCES %[1]s.totals (key)`,
	} {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			_, err := e.pool.Exec(context.Background(), fmt.Sprintf(ddl, e.tables.QuotedSchema()))
			require.NoError(t, err)
			_, err = Run(context.Background(), e.consumer(nil, nil), Options{Mode: idem.Rebuild, Projection: e.projection()})
			require.ErrorIs(t, err, ErrInvalidOptions)
			require.ErrorContains(t, err, map[string]string{"view": "rule _RETURN on view", "foreign key": "constraint notes_key_fkey",
				"trigger": "trigger noop", "serial": "default value for column id", "itself": "foreign key to itself"}[what])
			require.Zero(t, e.count(`SELECT count(*) FROM `+e.tables.Table("replay_runs")))
			require.Zero(t, e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE '%idem_rebuild'`, e.tables.Schema))
		})
	}
}

func TestSwappedTablesKeepTheirIndexNamesGrantsAndConstraints(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.projection()
	ctx := context.Background()
	role := e.tables.Schema + "_reader"
	s := e.tables.QuotedSchema()
	_, err := e.pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+`;
		GRANT SELECT ON `+s+`.totals TO `+pgx.Identifier{role}.Sanitize()+`;
		CREATE INDEX applied_message_idx ON `+s+`.applied (message_id);
		ALTER TABLE `+s+`.totals ADD CONSTRAINT sum_positive CHECK (sum >= 0)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize()+`; DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	e.publish(msgs(0, 20)...)
	e.runLive(e.consumer(&handler{e: e, proj: p}, nil), 19)
	list := func() string {
		var out string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT string_agg(indexname, ',' ORDER BY indexname) || ' / ' ||
			(SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE conrelid = $2::regclass) || ' / ' ||
			has_table_privilege($3, $2, 'SELECT')::text
			FROM pg_indexes WHERE schemaname = $1 AND tablename IN ('totals', 'applied')`, e.tables.Schema, s+".totals", role).Scan(&out))
		return out
	}
	before := list()
	require.Contains(t, before, "applied_message_idx,totals_pkey / sum_positive,totals_pkey / true")
	s2, err := Run(ctx, e.consumer(&handler{e: e, proj: p}, nil), Options{Mode: idem.Rebuild, Projection: p})
	require.NoError(t, err)
	require.True(t, s2.Swapped)
	require.Equal(t, before, list())
	e.requireAppliedOnce(20, 19)
}

func TestSwapHandsTheLiveScopeExactlyTheMessagesTheRebuiltTablesHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inb, err := inbox.New(inbox.Config{Tables: e.tables})
	require.NoError(t, err)
	r := &runner{pool: e.pool, ib: inb, tables: e.tables, cfg: consumer.Config{Name: "test"}, o: Options{Stream: "s"},
		row: &run{id: "r1"}}
	own := rebuildScope("test", "r1")
	ib := e.tables.Table("inbox")
	insert := func(scope, id string, offset int64, hash byte, source string) {
		h := make([]byte, 32)
		h[0] = hash
		_, err := e.pool.Exec(ctx, `INSERT INTO `+ib+` (consumer, message_id, payload_hash, source, stream_offset) VALUES ($1, $2, $3, $4, $5)`,
			scope, id, h, source, offset)
		require.NoError(t, err)
	}
	// The rebuild is at offset 10 when the swap prepares; it applies 11 and
	// 12 in the pause. Retention made the live scope forget offsets up to 3.
	for i := int64(0); i <= 12; i++ {
		id := fmt.Sprintf("m-%d", i)
		switch i {
		case 2: // forgotten by the live scope, below the horizon: stays forgotten
			insert(own, id, i, 1, "s")
		case 5, 11: // applied by the rebuild only
			insert(own, id, i, 1, "s")
		case 6, 12: // applied live only (the rebuild started after it, say)
			insert("test", id, i, 1, "s")
		case 7: // another payload under the id
			insert("test", id, i, 1, "s")
			insert(own, id, i, 2, "s")
		default:
			insert("test", id, i, 1, "s")
			insert(own, id, i, 1, "s")
		}
	}
	insert("test", "other-stream", 6, 1, "elsewhere") // not the rebuild's business
	_, err = e.pool.Exec(ctx, `INSERT INTO `+e.tables.Table("inbox_horizons")+` (consumer, source, forgotten_offset, forgotten_seen_at)
		VALUES ('test', 's', 3, now())`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO `+e.tables.Table("checkpoints")+` (consumer, stream, last_offset) VALUES ($1, 's', 10)`,
		runScope("test", "r1"))
	require.NoError(t, err)

	diff, err := r.diffInbox(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, diff.upTo)
	require.ElementsMatch(t, []string{"m-6"}, diff.forget)
	require.ElementsMatch(t, []string{"m-5", "m-7"}, diff.learn)
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return r.mergeInbox(ctx, tx, diff, []string{"m-11", "m-12"})
	}))
	rows, err := e.pool.Query(ctx, `SELECT message_id || ':' || get_byte(payload_hash, 0) FROM `+ib+` WHERE consumer = 'test' ORDER BY 1`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"m-0:1", "m-1:1", "m-3:1", "m-4:1", "m-5:1", "m-7:2", "m-8:1", "m-9:1", "m-10:1", "m-11:1",
		"other-stream:1"}, got, "m-2 stays forgotten, m-6 and m-12 are forgotten, m-5 and m-11 learnt, m-7 takes the rebuild's payload")
	h, ok, err := inb.Horizon(ctx, e.pool, "test", "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(12), *h.Offset, "the rows the hand-over deleted moved the live horizon")
}
