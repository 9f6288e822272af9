package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/projection"
	"github.com/idemkit/idem/replay"
)

// Invariants of the stream, its replays and its rebuilds.
const (
	invStreamOnce = "stream_applied_once" // each stream message applied once live, by a normal replay or a rebuild's catch-up, whatever the replays did
	invProjection = "projection_matches"  // chaos_proj holds each stream message once, with its amount, and nothing else
	invForensic   = "forensic_read_only"  // a forensic replay writes nothing
	invHorizon    = "replay_horizon"      // a normal replay from at or below the horizon is refused with ErrBeyondHorizon and applies nothing; one above it runs
	invReplayRuns = "replay_runs"         // a normal or repair replay runs to its end
	invRebuild    = "rebuild_swaps"       // a finished or resumed rebuild swaps its tables in; a killed one leaves the live projection untouched
	invAbandon    = "rebuild_abandon"     // an abandoned rebuild drops its shadows and leaves the live projection untouched
)

// newProjection declares chaos_proj, the stream consumer's projection.
func newProjection(schema string) (*projection.Projection, error) {
	p, err := projection.New(projection.Config{Name: projTable, Schema: schema, Tables: []string{projTable}})
	if err != nil {
		return nil, fmt.Errorf("chaos: projection: %w", err)
	}
	return p, nil
}

// applyStream is the stream consumer's handler, live and in replays: it
// upserts the deposit into chaos_proj, logs the application in
// chaos_stream_log (mode live, normal, repair, rebuild or catchup: a
// rebuild's message past the live checkpoint, written to the live table)
// and records the charge it asks for. In forensic mode it only reads.
// onApply, when set, runs after each application.
func applyStream(tables idem.Tables, led *ledger.Ledger, proj *projection.Projection, gatewayURL string, onApply func()) consumer.Handler {
	live := tables.QuotedSchema() + "." + projTable
	logSQL := `INSERT INTO ` + tables.QuotedSchema() + `.chaos_stream_log (message_id, mode) VALUES ($1, $2)`
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var d deposit
		if err := json.Unmarshal(m.Body, &d); err != nil || d.Amount == nil {
			return consumer.DeadLetter("invalid_deposit", fmt.Errorf("chaos: stream deposit %q: %v", m.ID, err))
		}
		table := proj.Table(ctx, projTable)
		mode := idem.ModeFrom(ctx)
		if mode == idem.Forensic {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE message_id = $1`, m.ID).Scan(&n); err != nil {
				return err
			}
		} else {
			name := string(mode)
			switch {
			case mode == idem.Live:
				name = "live"
			case mode == idem.Rebuild && table == live:
				name = "catchup"
			}
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO `+table+` AS t (message_id, amount) VALUES ($1, $2)
				ON CONFLICT (message_id) DO UPDATE SET amount = EXCLUDED.amount`, m.ID, *d.Amount)
			b.Queue(logSQL, m.ID, name)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		if d.Charge != "" {
			req, _ := json.Marshal(map[string]any{"behave": d.Charge, "amount": *d.Amount, "message_id": m.ID})
			if _, err := led.Record(ctx, tx, ledger.Effect{Type: chargeEffect, BusinessKey: m.ID, Target: gatewayURL,
				Request: json.RawMessage(req), Consumer: streamConsumer, MessageID: m.ID}); err != nil {
				return err
			}
		}
		if onApply != nil && mode != idem.Forensic {
			onApply()
		}
		return nil
	}
}

// publishStream publishes a deposit to the stream.
func (r *runner) publishStream(a Action) error {
	d := depositMsg{id: a.ID, amount: a.Amount, charge: a.Behave}
	r.model.stream = append(r.model.stream, d)
	if d.charge != "" {
		r.model.charges[d.id] = d.charge
	}
	return r.pub.publish(r.stream, d.body())
}

// replayConsumer is a consumer of the stream for a replay in the runner's
// process, straight to PostgreSQL and the broker; onApply runs after each
// application of its handler.
func (r *runner) replayConsumer(onApply func()) (*consumer.Consumer, error) {
	cfg := streamConfig(r.pool, r.flags(r.amqpURL, r.pgURL))
	cfg.Topology = consumer.Passive
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := consumer.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: replay consumer: %w", err)
	}
	c.Handle(applyStream(r.tables, r.led, r.proj, r.gw.URL(), onApply))
	return c, nil
}

// replay runs a replay of the stream, as an operator would, and checks
// what it must do on the spot.
func (r *runner) replay(ctx context.Context, a Action) error {
	n := len(r.model.stream)
	if n == 0 {
		return nil // the publishes were shrunk away
	}
	from := int64(min(a.Offset, n-1))
	c, err := r.replayConsumer(nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	note := func(inv string, ok bool, format string, args ...any) {
		r.obs.note(func(o *observations) { o.checks = append(o.checks, check{inv, ok, fmt.Sprintf(format, args...)}) })
	}
	switch a.Mode {
	case ReplayForensic:
		quiet := r.waitStreamCaughtUp(ctx, 15*time.Second)
		before, err := r.streamFootprint(ctx)
		if err != nil {
			return err
		}
		sum, err := replay.Run(ctx, c, replay.Options{Mode: idem.Forensic, From: replay.Offset(from), Report: io.Discard})
		after, ferr := r.streamFootprint(ctx)
		if ferr != nil {
			return ferr
		}
		r.door("replay forensic")
		note(invForensic, err == nil, "forensic replay from %d: %v (%+v)", from, err, sum)
		if quiet && r.streamCaughtUp(ctx) {
			note(invForensic, maps.Equal(before, after), "forensic replay from %d changed the tables: before %v, after %v", from, before, after)
			// The live consumer applied every message: the report says so,
			// or that retention forgot it.
			note(invForensic, err != nil || (sum.InboxNew == 0 && sum.InboxDuplicate+sum.Forgotten == sum.Messages),
				"forensic replay from %d of messages the live consumer applied: %d messages, %d new, %d duplicates, %d forgotten",
				from, sum.Messages, sum.InboxNew, sum.InboxDuplicate, sum.Forgotten)
		}
	case ReplayNormal:
		h, below, err := r.horizon(ctx, from)
		if err != nil {
			return err
		}
		logBefore, err := r.countLog(ctx, "normal")
		if err != nil {
			return err
		}
		sum, err := replay.Run(ctx, c, replay.Options{Mode: idem.Normal, From: replay.Offset(from)})
		if below {
			logAfter, lerr := r.countLog(ctx, "normal")
			if lerr != nil {
				return lerr
			}
			r.door("replay normal below the horizon")
			note(invHorizon, errors.Is(err, inbox.ErrBeyondHorizon) && sum.Processed == 0 && logAfter == logBefore,
				"normal replay from %d at or below the horizon %s: %v, %d processed, %d applications", from, h, err, sum.Processed, logAfter-logBefore)
			return nil
		}
		r.door("replay normal")
		note(invHorizon, !errors.Is(err, inbox.ErrBeyondHorizon), "normal replay from %d above the horizon %s refused: %v", from, h, err)
		note(invReplayRuns, err == nil, "normal replay from %d: %v", from, err)
	case ReplayRepair:
		sum, err := replay.Run(ctx, c, replay.Options{Mode: idem.Repair, From: replay.Offset(from), Operator: "chaos",
			Reason: "chaos repair", Select: replay.Selection{IDs: []string{a.Ref}}})
		r.door("replay repair")
		note(invReplayRuns, err == nil, "repair of %s from %d: %v (%+v)", a.Ref, from, err, sum)
	}
	return nil
}

// rebuild runs an online rebuild of chaos_proj; a killed one is killed by
// its handler's Seq-th application, then resumed or abandoned.
func (r *runner) rebuild(ctx context.Context, a Action) error {
	if len(r.model.stream) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	note := func(inv string, ok bool, format string, args ...any) {
		r.obs.note(func(o *observations) { o.checks = append(o.checks, check{inv, ok, fmt.Sprintf(format, args...)}) })
	}
	r.rebuilds++
	runID := fmt.Sprintf("chaos-%s-%d", r.id, r.rebuilds)
	opts := replay.Options{Mode: idem.Rebuild, Projection: r.proj, RunID: runID, BatchSize: 2}
	if a.Fate == RebuildFinish {
		c, err := r.replayConsumer(nil)
		if err != nil {
			return err
		}
		sum, err := replay.Run(ctx, c, opts)
		r.door("rebuild finished")
		note(invRebuild, err == nil && sum.Swapped, "rebuild %s: %v (swapped %v)", runID, err, sum.Swapped)
		return nil
	}
	runCtx, kill := context.WithCancel(ctx)
	defer kill()
	var applied atomic.Int64
	c, err := r.replayConsumer(func() {
		if applied.Add(1) == int64(a.Seq) {
			kill()
		}
	})
	if err != nil {
		return err
	}
	liveBefore, err := r.projRows(ctx, r.tables.QuotedSchema()+"."+projTable)
	if err != nil {
		return err
	}
	sum, err := replay.Run(runCtx, c, opts)
	if err == nil {
		r.door("rebuild finished before its kill")
		note(invRebuild, sum.Swapped, "rebuild %s finished before its kill without swapping", runID)
		return nil // it finished before its kill
	}
	liveAfter, lerr := r.projRows(ctx, r.tables.QuotedSchema()+"."+projTable)
	if lerr != nil {
		return lerr
	}
	r.door("rebuild killed")
	note(invRebuild, subset(liveBefore, liveAfter), "rebuild %s killed: the live projection lost or changed rows: before %v, after %v", runID, liveBefore, liveAfter)
	if a.Fate == RebuildResume {
		c, err := r.replayConsumer(nil)
		if err != nil {
			return err
		}
		sum, err := replay.Run(ctx, c, opts)
		r.door("rebuild resumed")
		note(invRebuild, err == nil && sum.Swapped && sum.Resumed, "rebuild %s resumed: %v (swapped %v, resumed %v)", runID, err, sum.Swapped, sum.Resumed)
		if err == nil {
			return nil
		}
	}
	err = replay.Abandon(ctx, r.pool, r.tables, runID)
	if errors.Is(err, replay.ErrRunMismatch) && !r.runRecorded(ctx, runID) {
		err = nil // killed before it recorded its run: nothing to abandon
	}
	liveAfter, lerr = r.projRows(ctx, r.tables.QuotedSchema()+"."+projTable)
	if lerr != nil {
		return lerr
	}
	shadows, serr := r.shadowTables(ctx)
	if serr != nil {
		return serr
	}
	r.door("rebuild abandoned")
	note(invAbandon, err == nil && shadows == 0 && subset(liveBefore, liveAfter),
		"rebuild %s abandoned: %v, %d shadow tables left, live before %v, after %v", runID, err, shadows, liveBefore, liveAfter)
	return nil
}

// subset reports whether every row of a is in b with the same amount.
func subset(a, b map[string]int64) bool {
	for id, v := range a {
		if w, ok := b[id]; !ok || w != v {
			return false
		}
	}
	return true
}

func (r *runner) runRecorded(ctx context.Context, runID string) bool {
	var n int
	_ = r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.tables.Table("replay_runs")+` WHERE run_id = $1`, runID).Scan(&n)
	return n > 0
}

func (r *runner) shadowTables(ctx context.Context) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE '%idem_rebuild'`,
		r.schema).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("chaos: counting shadow tables: %w", err)
	}
	return n, nil
}

// projRows reads a projection table: amount by message id.
func (r *runner) projRows(ctx context.Context, table string) (map[string]int64, error) {
	return queryMap(ctx, r.pool, `SELECT message_id, amount FROM `+table)
}

func queryMap(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (map[string]int64, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		out[k] = v
	}
	return out, rows.Err()
}

// horizon reads the stream consumer's inbox horizon and says whether a
// replay from offset from starts at or below it.
func (r *runner) horizon(ctx context.Context, from int64) (string, bool, error) {
	ib, err := inbox.New(inbox.Config{Tables: r.tables})
	if err != nil {
		return "", false, err
	}
	h, ok, err := ib.Horizon(ctx, r.pool, streamConsumer, r.stream)
	if err != nil {
		return "", false, fmt.Errorf("chaos: reading the horizon: %w", err)
	}
	if !ok || h.Offset == nil {
		return "none", false, nil
	}
	return fmt.Sprint(*h.Offset), from <= *h.Offset, nil
}

func (r *runner) countLog(ctx context.Context, mode string) (int64, error) {
	var n int64
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.tables.QuotedSchema()+`.chaos_stream_log WHERE mode = $1`, mode).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("chaos: %w", err)
	}
	return n, nil
}

// streamFootprint is what the stream consumer wrote: rows of each table
// it writes, and its checkpoint.
func (r *runner) streamFootprint(ctx context.Context) (map[string]int64, error) {
	s := r.tables.QuotedSchema()
	return queryMap(ctx, r.pool, `
		SELECT 'proj', count(*) FROM `+s+`.`+projTable+`
		UNION ALL SELECT 'log', count(*) FROM `+s+`.chaos_stream_log
		UNION ALL SELECT 'inbox', count(*) FROM `+r.tables.Table("inbox")+` WHERE consumer LIKE $1
		UNION ALL SELECT 'ledger', count(*) FROM `+r.tables.Table("ledger")+` WHERE consumer = $2
		UNION ALL SELECT 'dead', count(*) FROM `+r.tables.Table("dead_letters")+` WHERE consumer LIKE $1
		UNION ALL SELECT 'runs', count(*) FROM `+r.tables.Table("replay_runs")+`
		UNION ALL SELECT 'checkpoint', coalesce(max(last_offset), -1) FROM `+r.tables.Table("checkpoints")+` WHERE consumer = $2`,
		streamConsumer+"%", streamConsumer)
}

// streamCaughtUp reports whether the live stream consumer has applied
// every message published to the stream.
func (r *runner) streamCaughtUp(ctx context.Context) bool {
	var cp int64
	err := r.pool.QueryRow(ctx, `SELECT coalesce(max(last_offset), -1) FROM `+r.tables.Table("checkpoints")+` WHERE consumer = $1`,
		streamConsumer).Scan(&cp)
	return err == nil && cp >= int64(len(r.model.stream))-1
}

// waitStreamCaughtUp waits, at most for, until streamCaughtUp.
func (r *runner) waitStreamCaughtUp(ctx context.Context, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if r.streamCaughtUp(ctx) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// checkStream checks the stream's final state: each message applied once
// (live, by a normal replay or a rebuild's catch-up), the projection
// holding each with its amount and nothing else.
func (r *runner) checkStream(ctx context.Context, rep *report) {
	if len(r.model.stream) == 0 {
		return
	}
	proj, err := r.projRows(ctx, r.tables.QuotedSchema()+"."+projTable)
	if err != nil {
		rep.expect(invProjection, false, "reading chaos_proj: %v", err)
		return
	}
	once, err := queryMap(ctx, r.pool, `SELECT message_id, count(*) FILTER (WHERE mode <> 'repair') FROM `+r.tables.QuotedSchema()+
		`.chaos_stream_log WHERE mode IN ('live', 'normal', 'catchup', 'repair') GROUP BY message_id`)
	if err != nil {
		rep.expect(invStreamOnce, false, "reading chaos_stream_log: %v", err)
		return
	}
	want := map[string]int64{}
	for _, d := range r.model.stream {
		want[d.id] = d.amount
	}
	for _, id := range sortedKeys(want) {
		// A repair may apply a message the live consumer has not reached
		// yet: the live consumer then skips it, a duplicate.
		n, seen := once[id]
		rep.expect(invStreamOnce, seen && n <= 1, "stream message %s applied %d times live, by normal replays and catch-ups (applied at all: %v)", id, n, seen)
		got, ok := proj[id]
		rep.expect(invProjection, ok && got == want[id], "chaos_proj holds %s as %d (present %v), published with %d", id, got, ok, want[id])
	}
	for _, id := range sortedKeys(proj) {
		_, ok := want[id]
		rep.expect(invProjection, ok, "chaos_proj holds %s, never published", id)
	}
	shadows, err := r.shadowTables(ctx)
	rep.expect(invProjection, err == nil && shadows == 0, "%d shadow tables left (%v)", shadows, err)
}
